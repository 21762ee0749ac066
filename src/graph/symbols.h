// fusebox graph layer: symbolic dims (docs/graph-format.md, "Symbolic dims").
#pragma once

#include "fusebox/graph.h"

namespace fusebox::graph_symbols {

// What a valid symbolic spec keeps: every symbol with min <= default <= max
// and min >= 1; every dim_symbols entry naming a declared symbol, one entry
// per dim, its dim equal to the symbol's current value; no explicit strides
// or fixed values on a tensor with a symbolic dim (they could not follow the
// shape). resolve() checks it first.
Status check_symbols(const GraphSpec& spec);

// Letters, digits and '_', not starting with a digit: names stay readable in
// messages and unambiguous in "--shape B=8,S=128".
bool is_symbol_name(std::string_view name);

// "dim 0 of 'x'": where a symbol is used, for messages ("" if unused).
std::string symbol_use(const GraphSpec& spec, const std::string& symbol);

}  // namespace fusebox::graph_symbols
