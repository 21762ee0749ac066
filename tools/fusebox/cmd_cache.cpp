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
  auto* cmd = app.add_subcommand("cache", "Inspect and manage the plan cache: ls, show KEY, verify, rm KEY-PREFIX, "
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
  cmd->add_option("--cache", a->path, "Plan cache file (default $FUSEBOX_CACHE or ~/.cache/fusebox/plans.sqlite)");
  cmd->add_flag("--json", a->json, "Write one JSON document to stdout");
  return [a]() {
    const bool needs_arg = a->action == "show" || a->action == "rm" || a->action == "merge" ||
                           a->action == "export" || a->action == "import";
    if (needs_arg && a->arg.empty()) {
      return fail("cache", InvalidArgument("'cache " + a->action + "' needs an argument (see fusebox cache --help)"));
    }
    PlanCache cache = PlanCache::open(a->path.empty() ? default_cache_path() : a->path);
    print_warnings(cache.warnings());
    if (!cache.enabled()) return fail("cache", IoError(cache.path() + ": plan cache unavailable"));
    nlohmann::json out = {{"cache", cache.path()}, {"action", a->action}};
    if (a->action == "ls" || a->action == "show") {
      auto entries = cache.list(false);
      if (!entries.ok()) return fail("cache", entries.status());
      nlohmann::json list = nlohmann::json::array();
      int shown = 0;
      for (const auto& e : *entries) {
        if (a->action == "show" && e.key.rfind(a->arg, 0) != 0) continue;
        ++shown;
        list.push_back(entry_json(e));
        if (a->json) continue;
        if (a->action == "ls") {
          std::printf("%s  %-44s %-12s %s  %s  %s\n", e.key.c_str(), e.info.engine.c_str(), e.info.device_name.c_str(),
                      e.tuned_median_ms >= 0 ? "tuned" : "heuristic", e.info.built_deviceless ? "deviceless" : "gpu",
                      e.last_used_utc.c_str());
        } else {
          std::printf("%s\n", entry_json(e).dump(2).c_str());
        }
      }
      if (a->action == "show" && shown == 0) return fail("cache", InvalidArgument("no entry with key " + a->arg));
      if (!a->json && a->action == "ls") std::printf("%d entries, %lld bytes\n", shown, static_cast<long long>(cache.total_bytes()));
      out["entries"] = list;
    } else if (a->action == "verify") {
      std::vector<std::string> bad;
      auto checked = cache.verify(&bad);
      if (!checked.ok()) return fail("cache", checked.status());
      out["checked"] = *checked;
      out["bad"] = bad;
      if (!a->json) {
        std::printf("%d entries checked, %zu bad\n", *checked, bad.size());
        for (const auto& k : bad) std::printf("  bad: %s\n", k.c_str());
      }
      if (a->json) std::printf("%s\n", out.dump(2).c_str());
      return bad.empty() ? kExitOk : kExitFailure;
    } else {
      Status st;
      if (a->action == "rm") st = cache.remove(a->arg);
      if (a->action == "clear") st = cache.clear();
      if (a->action == "export") st = cache.export_to(a->arg);
      const size_t before = cache.warnings().size();
      if (a->action == "import" || a->action == "merge") st = cache.import_from(a->arg);
      print_warnings({cache.warnings().begin() + static_cast<std::ptrdiff_t>(before), cache.warnings().end()});
      if (!st.ok()) return fail("cache", st);
      if (!a->json) std::printf("cache %s: ok\n", a->action.c_str());
    }
    if (a->json) std::printf("%s\n", out.dump(2).c_str());
    return kExitOk;
  };
}

}  // namespace fusebox::cli
