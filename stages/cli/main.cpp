// flashstep: the main job. See cli.h and README.md.
#include <iostream>
#include <string>
#include <vector>

#include "cli.h"

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  return flashstep::cli::run(args, std::cout, std::cerr);
}
