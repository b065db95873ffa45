// ffctl: what the node's router holds, for the node's root (or `kubectl exec` into the
// router's pod). parse -> ask the router over its admin socket -> print a table or JSON.
//   ffctl [--dir DIR] [--name NAME] [-o table|json] pods|qps [ADDRESS]|links|quotas|events
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "admin_client.h"
#include "freeflow/router_socket.h"
#include "freeflow/version.h"
#include "tables.h"

int main(int argc, char** argv) {
  CLI::App app{"ffctl: what this node's freeflow router holds (docs/metrics.md)"};
  app.set_version_flag("--version", ff::VersionLine("ffctl"));
  std::string dir = ff::kDefaultFreeflowDir, name = ff::kDefaultRouterName, output = "table";
  app.add_option("--dir", dir, "the router's host folder")->envname("FREEFLOW_DIR");
  app.add_option("--name", name, "the router's name")->envname("FFR_NAME");
  app.add_option("-o,--output", output, "table or json")->check(CLI::IsMember({"table", "json"}));
  app.require_subcommand(1);
  std::string pod;
  app.add_subcommand("pods", "pods that hold anything: sessions, QPs, memory, refusals");
  app.add_subcommand("qps", "queue pairs: owner, type, the peer named, producers")
      ->add_option("address", pod, "only the QPs of the pod at this overlay address");
  app.add_subcommand("links", "links to the other nodes' routers");
  app.add_subcommand("quotas", "each quota, its refusals, and the pod that holds most");
  app.add_subcommand("events", "the router's last refusals, with their reasons");
  CLI11_PARSE(app, argc, argv);
  const std::string command = app.get_subcommands().front()->get_name();
  std::string error;
  const std::string text =
      ff::ctl::Ask(dir, name, command + (pod.empty() ? "" : " " + pod), &error);
  if (text.empty()) {
    std::fprintf(stderr, "ffctl: %s\n", error.c_str());
    return 1;
  }
  nlohmann::json answer = nlohmann::json::parse(text, nullptr, false);
  if (answer.is_discarded()) {
    std::fprintf(stderr, "ffctl: the router's answer is not JSON\n");
    return 1;
  }
  if (answer.contains("error")) {
    std::fprintf(stderr, "ffctl: %s\n", answer["error"].get<std::string>().c_str());
    return 1;
  }
  try {
    std::cout << (output == "json" ? answer.dump(2) + "\n" : ff::ctl::Table(command, answer));
  } catch (const nlohmann::json::exception& e) {
    std::fprintf(stderr, "ffctl: the router's answer is not what %s expects: %s\n", command.c_str(),
                 e.what());
    return 1;
  }
  return 0;
}
