// rvbpfd entry point: only wires modules (see src/cli/).
#include "cli/cli.h"

int main(int argc, char** argv) { return rvbpfd::RunCli(argc, argv); }
