// zimage command-line program: one subcommand per job (apps/cli/commands.h). Every error ends in
// a message and an exit code, never a crash: usage errors exit 2, failures exit 1.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <new>

#include "commands.h"
#include "zimage/zimage.h"

int main(int argc, char** argv) {
  CLI::App app{"zimage: Z-Image-Turbo text-to-image inference engine"};
  app.require_subcommand(1);
  app.set_version_flag("--version,-V", std::string("zimage ") + zimage::kVersion);
  app.add_subcommand("version", "Print the version")->callback([] {
    std::printf("zimage %s\n", zimage::kVersion);
  });
  zimage::cli::register_generate_command(app);
  zimage::cli::register_make_random_model_command(app);
  zimage::cli::register_make_random_lora_command(app);
  zimage::cli::register_bench_command(app);
  zimage::cli::register_info_command(app);
  zimage::cli::register_tokenize_command(app);
  zimage::cli::register_serve_command(app);
  zimage::cli::register_convert_command(app);
  zimage::cli::register_worker_command(app);
  zimage::cli::register_submit_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints help / the usage error; silent for RuntimeError
    if (code == 0 || e.get_name() == "RuntimeError") return code;
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "zimage: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zimage: %s\n", e.what());
    return 1;
  }
  return 0;
}
