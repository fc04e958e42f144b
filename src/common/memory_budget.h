// One memory budget (bytes) shared by the caches that grow with what target processes do: the fleet agent's
// per-process frame caches, stack tables and their fixed costs (docs/deploy.md, "Memory budget").
//
// Each consumer holds an Account and charges it, before it allocates, with the bytes it will hold (strings by
// capacity plus a per-entry overhead; the consumer's estimate, never an entry count), and releases them when it
// frees them. A charge is granted only when afterwards
//   - the account holds at most its fair share: budget / number of open accounts, and
//   - all accounts together hold at most the budget.
// To make room, the budget evicts: first the charging account itself when it is past its share (if the caller allows
// it), then the other accounts, the one holding the most bytes first (the oldest among equals), until the charge
// fits. An account is evicted by its evictor, which frees what it can (a cache cleared: its frames are named again
// later) and releases those bytes; an account without an evictor, or whose evictor frees nothing, is not evicted
// again in that charge. A charge that still does not fit is refused and nothing is charged: the consumer does
// without (does not cache, or marks what it dropped).
//
// So the accounts' total never exceeds the budget; a new account (which lowers every share) is made room for by the
// next charges, largest holder first.
//
// Threading: not thread-safe; one thread (the agent's main loop). Evictors run inside Charge, on that thread, and
// must not charge.
#ifndef RVBPFD_SRC_COMMON_MEMORY_BUDGET_H_
#define RVBPFD_SRC_COMMON_MEMORY_BUDGET_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace rvbpfd {

class MemoryBudget {
 public:
  class Account {
   public:
    ~Account();  // releases what it holds and leaves the budget
    Account(const Account&) = delete;
    Account& operator=(const Account&) = delete;

    // Asks for `bytes` more (see above); true when granted. `may_evict_self`: whether this account's own evictor may
    // run to make room (false while the caller holds pointers into what it would free).
    bool Charge(size_t bytes, bool may_evict_self = true);
    void Release(size_t bytes);  // at most what it holds
    // Frees what this account can give back and Releases it; null: nothing to evict.
    void set_evictor(std::function<void()> evict) { evict_ = std::move(evict); }
    size_t held() const { return held_; }
    uint64_t evictions() const { return evictions_; }  // times its evictor ran

   private:
    friend class MemoryBudget;
    Account(MemoryBudget* budget, uint64_t serial) : budget_(budget), serial_(serial) {}
    MemoryBudget* budget_;
    uint64_t serial_;  // opening order: the oldest is evicted first among equal holders
    size_t held_ = 0;
    uint64_t evictions_ = 0;
    std::function<void()> evict_;
  };

  explicit MemoryBudget(size_t budget_bytes) : budget_(budget_bytes) {}
  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;
  ~MemoryBudget();  // accounts must be closed first

  std::unique_ptr<Account> Open();

  size_t budget() const { return budget_; }
  size_t held() const { return held_; }
  size_t peak_held() const { return peak_held_; }
  // An account's fair share now: budget / open accounts (the whole budget when there are none).
  size_t share() const { return accounts_.empty() ? budget_ : budget_ / accounts_.size(); }
  size_t accounts() const { return accounts_.size(); }
  uint64_t evictions() const { return evictions_; }  // evictor runs, all accounts
  uint64_t evicted_bytes() const { return evicted_bytes_; }
  uint64_t refused() const { return refused_; }      // charges refused

 private:
  bool Charge(Account* a, size_t bytes, bool may_evict_self);
  // Runs `a`'s evictor; false when it freed nothing.
  bool Evict(Account* a);
  // The account holding the most bytes (oldest among equals) other than `except` and not in `spent`, or null.
  Account* LargestOther(const Account* except, const std::vector<Account*>& spent) const;

  size_t budget_;
  size_t held_ = 0;
  size_t peak_held_ = 0;
  uint64_t next_serial_ = 0;
  uint64_t evictions_ = 0;
  uint64_t evicted_bytes_ = 0;
  uint64_t refused_ = 0;
  std::vector<Account*> accounts_;  // open accounts, in opening order
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_COMMON_MEMORY_BUDGET_H_
