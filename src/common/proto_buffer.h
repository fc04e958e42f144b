// ProtoBuffer: appends protobuf wire format (https://protobuf.dev/programming-guides/encoding/) to a string, for
// the few messages rvbpfd writes by hand (pprof's Profile, Pyroscope's PushRequest) without a protobuf runtime.
#ifndef RVBPFD_SRC_COMMON_PROTO_BUFFER_H_
#define RVBPFD_SRC_COMMON_PROTO_BUFFER_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace rvbpfd {

// Varint fields (wire type 0) and length-delimited fields (wire type 2), including packed repeated varints. Nested
// messages are built in their own buffer and appended with their length.
class ProtoBuffer {
 public:
  explicit ProtoBuffer(std::string* out) : out_(out) {}
  void Varint(uint64_t v) {
    while (v >= 0x80) {
      out_->push_back(static_cast<char>((v & 0x7f) | 0x80));
      v >>= 7;
    }
    out_->push_back(static_cast<char>(v));
  }
  void Tag(uint32_t field, uint32_t wire_type) { Varint((static_cast<uint64_t>(field) << 3) | wire_type); }
  // int64 fields are varints of the two's complement value; proto3 leaves zero values out.
  void IntField(uint32_t field, int64_t v) {
    if (v == 0) return;
    Tag(field, 0);
    Varint(static_cast<uint64_t>(v));
  }
  void BoolField(uint32_t field, bool v) {
    if (!v) return;
    Tag(field, 0);
    Varint(1);
  }
  void BytesField(uint32_t field, std::string_view bytes) {
    Tag(field, 2);
    Varint(bytes.size());
    out_->append(bytes);
  }
  template <typename Int>
  void PackedField(uint32_t field, std::span<const Int> values) {
    if (values.empty()) return;
    std::string packed;
    ProtoBuffer p(&packed);
    for (Int v : values) p.Varint(static_cast<uint64_t>(v));
    BytesField(field, packed);
  }

 private:
  std::string* out_;
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_COMMON_PROTO_BUFFER_H_
