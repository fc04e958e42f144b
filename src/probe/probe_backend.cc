#include "probe/probe_backend.h"

namespace rvbpfd {

Result<std::unique_ptr<BpfProbeBackend>> BpfProbeBackend::Open(uint32_t ring_buffer_bytes, const rv_config& config,
                                                                const std::string& cache_dir) {
  std::unique_ptr<BpfProbeBackend> b(new BpfProbeBackend());
  SessionOptions so;
  so.ring_buffer_bytes = ring_buffer_bytes;
  so.watch_processes = true;
  so.config = config;
  so.cache_dir = cache_dir;
  BpfProbeBackend* self = b.get();
  Result<std::unique_ptr<BpfSession>> s = BpfSession::Open(so, [self](const rv_record& r) {
    if (self->on_record_) self->on_record_(r);
  });
  if (!s) return s.error();
  b->session_ = std::move(s.value());
  b->session_->SetStackCallback(
      [self](const rv_record& r, const rv_stack_header& h, std::span<const rv_ruby_frame> frames,
             const rv_gvl_reading* gvl) {
        if (self->on_stack_) self->on_stack_(r, h, frames, gvl);
      });
  return b;
}

void BpfProbeBackend::SetHandlers(RecordHandler on_record, StackHandler on_stack) {
  on_record_ = std::move(on_record);
  on_stack_ = std::move(on_stack);
}

Result<int> BpfProbeBackend::AttachGroup(const std::string& path, const std::vector<SiteSpec>& sites) {
  Result<std::unique_ptr<SiteGroup>> g = session_->Attach(path, sites, -1);
  if (!g) return g.error();
  groups_.push_back(std::move(g.value()));
  return static_cast<int>(groups_.size() - 1);
}

void BpfProbeBackend::DetachGroup(int group) {
  // Ordered by the sites' hits so far (BpfSession::Detach: the hot breakpoints go first).
  if (group >= 0 && static_cast<size_t>(group) < groups_.size()) {
    session_->Detach(*groups_[group], session_->ReadSiteHits());
  }
}

Status BpfProbeBackend::ReattachGroup(int group, const std::string& path) {
  if (group < 0 || static_cast<size_t>(group) >= groups_.size()) {
    return Error(ErrorCode::kInternal, "no probe group " + std::to_string(group));
  }
  return session_->Reattach(*groups_[group], path);
}

bool BpfProbeBackend::GroupAttached(int group) const {
  return group >= 0 && static_cast<size_t>(group) < groups_.size() && groups_[group]->attached();
}

}  // namespace rvbpfd
