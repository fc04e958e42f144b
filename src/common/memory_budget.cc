#include "common/memory_budget.h"

#include <algorithm>

namespace rvbpfd {

MemoryBudget::Account::~Account() {
  Release(held_);
  std::erase(budget_->accounts_, this);
}

bool MemoryBudget::Account::Charge(size_t bytes, bool may_evict_self) {
  return budget_->Charge(this, bytes, may_evict_self);
}

void MemoryBudget::Account::Release(size_t bytes) {
  bytes = std::min(bytes, held_);
  held_ -= bytes;
  budget_->held_ -= bytes;
}

MemoryBudget::~MemoryBudget() {
  // Accounts outliving their budget would write into freed memory: detach them (their bytes are forgotten).
  for (Account* a : accounts_) a->held_ = 0;
}

std::unique_ptr<MemoryBudget::Account> MemoryBudget::Open() {
  std::unique_ptr<Account> a(new Account(this, next_serial_++));
  accounts_.push_back(a.get());
  return a;
}

bool MemoryBudget::Evict(Account* a) {
  if (!a->evict_ || a->held_ == 0) return false;
  const size_t before = a->held_;
  a->evict_();
  ++a->evictions_;
  ++evictions_;
  if (a->held_ >= before) return false;
  evicted_bytes_ += before - a->held_;
  return true;
}

MemoryBudget::Account* MemoryBudget::LargestOther(const Account* except, const std::vector<Account*>& spent) const {
  Account* best = nullptr;
  for (Account* a : accounts_) {  // opening order: the first of equal holders is the oldest
    if (a == except || a->held_ == 0 || std::find(spent.begin(), spent.end(), a) != spent.end()) continue;
    if (best == nullptr || a->held_ > best->held_) best = a;
  }
  return best;
}

bool MemoryBudget::Charge(Account* a, size_t bytes, bool may_evict_self) {
  const size_t share = this->share();
  if (bytes > share) {
    ++refused_;
    return false;
  }
  if (a->held_ > share - bytes && !(may_evict_self && Evict(a) && a->held_ <= share - bytes)) {
    ++refused_;
    return false;
  }
  std::vector<Account*> spent;  // evicted (or with nothing to evict) in this charge
  while (held_ > budget_ - bytes) {
    Account* victim = LargestOther(a, spent);
    if (victim == nullptr) {
      // Only this account is left to give room.
      if (!may_evict_self || !Evict(a) || held_ > budget_ - bytes) {
        ++refused_;
        return false;
      }
      break;
    }
    spent.push_back(victim);
    Evict(victim);
  }
  a->held_ += bytes;
  held_ += bytes;
  peak_held_ = std::max(peak_held_, held_);
  return true;
}

}  // namespace rvbpfd
