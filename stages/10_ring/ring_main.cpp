// flashstep_ring: ring attention over the visible GPUs. See ring_cli.h and README.md.
#include <iostream>
#include <string>
#include <vector>

#include "ring_cli.h"

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  return flashstep::ring::ring_main(args, std::cout, std::cerr);
}
