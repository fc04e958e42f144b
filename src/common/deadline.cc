#include "common/deadline.h"

namespace rvbpfd {

std::atomic<int>& StuckDeadlineThreads() {
  static std::atomic<int> stuck{0};
  return stuck;
}

}  // namespace rvbpfd
