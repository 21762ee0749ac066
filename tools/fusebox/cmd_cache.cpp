// fusebox cache: inspect and manage the plan cache.
#include <cstdio>

#include "common.h"

namespace fusebox::cli {
namespace {

nlohmann::json entry_json(const CacheEntry& e) {
  return {{"key", e.key},
          {"engine", e.info.engine},
          {"workspace_bytes", e.info.workspace_bytes},
          {"tuned_median_ms", e.tuned_median_ms},
          {"tuned", e.tuned_median_ms >= 0},
          {"device", e.info.device_name},
          {"sm_version", e.info.sm_version},
          {"sm_count", e.info.sm_count},
          {"built_deviceless", e.info.built_deviceless},
          {"cudnn", e.info.cudnn_version},
          {"frontend", e.info.frontend_version},
          {"fusebox", e.info.fusebox_version},
          {"graph_fingerprint", e.info.graph_fingerprint},
          {"created_utc", e.created_utc},
          {"last_used_utc", e.last_used_utc},
          {"payload_bytes", e.payload_bytes}};
}

}  // namespace

Runner add_cache(CLI::App& app) {
  auto* cmd = app.add_subcommand("cache",
                                 "Inspect and manage the plan cache: ls, show KEY, verify, rm KEY-PREFIX, "
                                 "clear, merge FILE, export FILE, import FILE");
  struct Args {
    std::string action, arg, path;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("action", a->action, "ls | show | verify | rm | clear | merge | export | import")
      ->required()
      ->check(CLI::IsMember({"ls", "show", "verify", "rm", "clear", "merge", "export", "import"}));
  cmd->add_option("arg", a->arg, "KEY (show), KEY-PREFIX (rm), FILE (merge, export, import)");
  cmd->add_option("--cache", a->path,
                  "Plan cache file (default $FUSEBOX_CACHE or ~/.cache/fusebox/plans.sqlite)");
  cmd->add_flag("--json", a->json, "Write one JSON document to stdout");
  return [a]() {
    const std::string& act = a->action;
    const bool needs_arg =
        act == "show" || act == "rm" || act == "merge" || act == "export" || act == "import";
    if (needs_arg && a->arg.empty()) {
      return fail("cache",
                  InvalidArgument("'cache " + act + "' needs an argument (see fusebox cache --help)"));
    }
    if (!needs_arg && !a->arg.empty()) {
      return fail("cache", InvalidArgument("'cache " + act + "' takes no argument, got '" + a->arg +
                                           "' (see fusebox cache --help)"));
    }
    const std::string path = a->path.empty() ? default_cache_path() : a->path;
    // Only import and merge may create a cache; the others read or change an
    // existing one, and a mistyped path must not leave an empty database behind.
    const bool may_create = act == "import" || act == "merge";
    const bool read_only = act == "ls" || act == "show" || act == "verify" || act == "export";
    if (!may_create && !common::file_id(path)) {
      return fail("cache", IoError("plan cache '" + path +
                                   "' does not exist (nothing was created; give --cache PATH "
                                   "or set FUSEBOX_CACHE)"));
    }
    PlanCacheOptions options;
    options.read_only = read_only;
    PlanCache cache = PlanCache::open(path, options);
    print_warnings(cache.warnings());
    if (!cache.enabled()) return fail("cache", IoError(cache.path() + ": plan cache unavailable"));
    nlohmann::json out = {{"cache", cache.path()}, {"action", act}};
    if (act == "ls" || act == "show") {
      auto entries = cache.list(false);
      if (!entries.ok()) return fail("cache", entries.status());
      nlohmann::json list = nlohmann::json::array();
      int shown = 0;
      for (const auto& e : *entries) {
        if (act == "show" && e.key.rfind(a->arg, 0) != 0) continue;
        ++shown;
        list.push_back(entry_json(e));
        if (a->json) continue;
        if (act == "ls") {
          std::printf("%s  %-44s %-12s %s  %s  %s\n", safe(e.key).c_str(), safe(e.info.engine).c_str(),
                      safe(e.info.device_name).c_str(), e.tuned_median_ms >= 0 ? "tuned" : "heuristic",
                      e.info.built_deviceless ? "deviceless" : "gpu", safe(e.last_used_utc).c_str());
        } else {
          std::printf("%s\n", common::printable(dump(entry_json(e)), /*keep_newlines=*/true).c_str());
        }
      }
      if (act == "show" && shown == 0) return fail("cache", InvalidArgument("no entry with key " + a->arg));
      if (!a->json && act == "ls") {
        std::printf("%d entries, %lld bytes\n", shown, static_cast<long long>(cache.total_bytes()));
      }
      out["entries"] = list;
    } else if (act == "verify") {
      std::vector<std::string> bad, why;
      auto checked = cache.verify(&bad, &why);
      if (!checked.ok()) return fail("cache", checked.status());
      out["checked"] = *checked;
      out["bad"] = bad;
      out["bad_reasons"] = why;
      if (!a->json) {
        std::printf("%d entries checked, %zu bad\n", *checked, bad.size());
        // Why lookup() would refuse (and delete) the entry.
        for (size_t i = 0; i < bad.size(); ++i) std::printf("  bad: %s\n", safe(why[i]).c_str());
      }
      if (a->json) std::printf("%s\n", dump(out).c_str());
      return bad.empty() ? kExitOk : kExitFailure;
    } else {
      Status st;
      int64_t removed = -1;
      if (act == "rm") st = cache.remove(a->arg, &removed);
      if (act == "clear") st = cache.clear(&removed);
      if (act == "export") st = cache.export_to(a->arg);
      const size_t before = cache.warnings().size();
      if (act == "import" || act == "merge") st = cache.import_from(a->arg);
      print_warnings(
          {cache.warnings().begin() + static_cast<std::ptrdiff_t>(before), cache.warnings().end()});
      if (!st.ok()) return fail("cache", st);
      if (removed >= 0) out["removed"] = removed;
      if (!a->json) {
        if (removed >= 0) {
          std::printf("cache %s: removed %lld %s\n", act.c_str(), static_cast<long long>(removed),
                      removed == 1 ? "entry" : "entries");
        } else if (act == "export") {
          std::printf("cache export: wrote %s\n", safe(a->arg).c_str());
        } else {
          std::printf("cache %s: ok\n", act.c_str());
        }
      }
    }
    if (a->json) std::printf("%s\n", dump(out).c_str());
    return kExitOk;
  };
}

}  // namespace fusebox::cli
