// zimage command-line program. Subcommands are added as the engine grows.
#include <cstdio>

#include <CLI/CLI.hpp>

int main(int argc, char** argv) {
  CLI::App app{"zimage: Z-Image-Turbo text-to-image inference engine"};
  app.require_subcommand(1);
  app.add_subcommand("version", "Print the version")->callback([] { std::puts("zimage 0.1.0"); });
  CLI11_PARSE(app, argc, argv);
  return 0;
}
