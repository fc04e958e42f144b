#include "probe/probe_backend.h"

namespace rvbpfd {

Result<std::unique_ptr<BpfProbeBackend>> BpfProbeBackend::Open(const SessionOptions& options) {
  std::unique_ptr<BpfProbeBackend> b(new BpfProbeBackend());
  BpfProbeBackend* self = b.get();
  Result<std::unique_ptr<BpfSession>> s = BpfSession::Open(options, [self](const rv_record& r) {
    if (self->on_record_) self->on_record_(r);
  });
  if (!s) return s.error();
  b->session_ = std::move(s.value());
  return b;
}

Result<std::unique_ptr<BpfProbeBackend>> BpfProbeBackend::Open(uint32_t ring_buffer_bytes, const rv_config& config,
                                                                const std::string& cache_dir) {
  SessionOptions so;
  so.ring_buffer_bytes = ring_buffer_bytes;
  so.watch_processes = true;
  so.config = config;
  so.cache_dir = cache_dir;
  return Open(so);
}

void BpfProbeBackend::SetHandlers(RecordHandler on_record, StackHandler on_stack) {
  on_record_ = std::move(on_record);
  on_stack_ = std::move(on_stack);
  // The session hands records with a stack to its stack callback only when it has one (else the record goes to the
  // record callback and samples are dropped): it gets one exactly when a stack handler was given.
  if (!on_stack_) {
    session_->SetStackCallback(nullptr);
    return;
  }
  session_->SetStackCallback([this](const rv_record& r, const rv_stack_header& h,
                                    std::span<const rv_ruby_frame> frames,
                                    const rv_gvl_reading* gvl) { on_stack_(r, h, frames, gvl); });
}

ProcessEcInstaller::State BpfProbeBackend::PollEc(ProcessEcInstaller& installer) {
  std::optional<rv_proc_ec> pe = installer.Resolve();
  if (!pe) return installer.state();
  if (Status st = session_->SetProcEc(static_cast<uint32_t>(installer.pid()), *pe); !st) {
    return installer.Failed(st.error().message());
  }
  return installer.Installed();
}

SiteGroup* BpfProbeBackend::GroupAt(int group) const {
  if (group < 0 || static_cast<size_t>(group) >= groups_.size()) return nullptr;
  return groups_[static_cast<size_t>(group)].get();
}

Result<int> BpfProbeBackend::AttachGroup(const std::string& path, const std::vector<SiteSpec>& sites, int pid) {
  Result<std::unique_ptr<SiteGroup>> g = session_->Attach(path, sites, pid);
  if (!g) return g.error();
  groups_.push_back(std::move(g.value()));
  return static_cast<int>(groups_.size() - 1);
}

void BpfProbeBackend::DetachGroup(int group, std::span<const uint64_t> site_hits) {
  if (SiteGroup* g = GroupAt(group)) session_->Detach(*g, site_hits);
}

void BpfProbeBackend::DetachGroup(int group) {
  if (SiteGroup* g = GroupAt(group)) session_->Detach(*g, session_->ReadSiteHits());
}

Status BpfProbeBackend::ReattachGroup(int group, const std::string& path) {
  SiteGroup* g = GroupAt(group);
  if (g == nullptr) return Error(ErrorCode::kInternal, "no probe group " + std::to_string(group));
  return session_->Reattach(*g, path);
}

bool BpfProbeBackend::GroupAttached(int group) const {
  const SiteGroup* g = GroupAt(group);
  return g != nullptr && g->attached();
}

std::vector<uint64_t> BpfProbeBackend::GroupCookies(int group) const {
  const SiteGroup* g = GroupAt(group);
  return g != nullptr ? g->cookies() : std::vector<uint64_t>{};
}

void BpfProbeBackend::ReleaseGroup(int group) {
  // Only the one slot is written: another thread may release another group meanwhile.
  if (group >= 0 && static_cast<size_t>(group) < groups_.size()) groups_[static_cast<size_t>(group)].reset();
}

}  // namespace rvbpfd
