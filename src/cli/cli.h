#ifndef RVBPFD_SRC_CLI_CLI_H_
#define RVBPFD_SRC_CLI_CLI_H_

namespace rvbpfd {

// Parses the command line and runs the chosen command; returns the process exit status.
int RunCli(int argc, char** argv);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_CLI_CLI_H_
