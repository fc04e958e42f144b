// The built BPF object (build/bpf/rvbpfd.bpf.o) has no CO-RE relocation: with one, libbpf parses the kernel's BTF
// (~10 ms) for each of BpfSession's three instances of the object at every start. Kernel struct fields are read at
// offsets userspace hands over instead (rv_kernel_layout, probe/kernel_layout.h). No root needed.
#include <fcntl.h>
#include <gelf.h>
#include <gtest/gtest.h>
#include <libelf.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>

namespace rvbpfd {
namespace {

// The fixed part of the .BTF.ext header (the kernel's and libbpf's struct btf_ext_header): core_relo_* exist when
// hdr_len covers them.
struct BtfExtHeader {
  uint16_t magic;
  uint8_t version;
  uint8_t flags;
  uint32_t hdr_len;
  uint32_t func_info_off;
  uint32_t func_info_len;
  uint32_t line_info_off;
  uint32_t line_info_len;
  uint32_t core_relo_off;
  uint32_t core_relo_len;
};
static_assert(sizeof(BtfExtHeader) == 32);
constexpr uint16_t kBtfMagic = 0xeB9F;

TEST(BpfObject, HasNoCoreRelocations) {
  // An EM_BPF relocatable object, which src/elf (x86-64 binaries only) does not open: read with libelf.
  const std::string path = std::string(RVBPFD_BINARY_DIR) + "/bpf/rvbpfd.bpf.o";
  ASSERT_NE(elf_version(EV_CURRENT), EV_NONE);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0) << path;
  Elf* elf = elf_begin(fd, ELF_C_READ, nullptr);
  ASSERT_NE(elf, nullptr) << elf_errmsg(-1);
  size_t shstrndx = 0;
  ASSERT_EQ(elf_getshdrstrndx(elf, &shstrndx), 0);
  std::string ext;
  for (Elf_Scn* scn = elf_nextscn(elf, nullptr); scn != nullptr; scn = elf_nextscn(elf, scn)) {
    GElf_Shdr shdr;
    if (gelf_getshdr(scn, &shdr) == nullptr) continue;
    const char* name = elf_strptr(elf, shstrndx, shdr.sh_name);
    Elf_Data* data = elf_getdata(scn, nullptr);
    if (name != nullptr && std::string(name) == ".BTF.ext" && data != nullptr && data->d_buf != nullptr) {
      ext.assign(static_cast<const char*>(data->d_buf), data->d_size);
    }
  }
  elf_end(elf);
  close(fd);
  ASSERT_GE(ext.size(), 24u) << path << " has no .BTF.ext (built without -g?)";
  BtfExtHeader hdr{};
  std::memcpy(&hdr, ext.data(), std::min(sizeof(hdr), ext.size()));
  ASSERT_EQ(hdr.magic, kBtfMagic);
  // The line and function info are there (the object is the real one, built with -g)...
  EXPECT_GT(hdr.line_info_len, 0u);
  // ...but no CO-RE relocation record beyond the section's 4-byte record-size word.
  if (hdr.hdr_len >= sizeof(BtfExtHeader)) {
    EXPECT_LE(hdr.core_relo_len, 4u) << "bpf/ reads a kernel struct through CO-RE (BPF_CORE_READ, a vmlinux.h struct "
                                        "with preserve_access_index): give its offset through rv_kernel_layout";
  }
}

}  // namespace
}  // namespace rvbpfd
