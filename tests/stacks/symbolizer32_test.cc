// CRuby 3.2 class paths in the symbolizer, on synthetic memory: a class's hidden ivars (__classpath__,
// __tmp_classpath__, __attached__) live in object shapes (the shape id in the upper half of the flags,
// vm->shape_list[id], rb_shape_get_iv_index's walk up parent_id) with the values in RCLASS_EXT(klass)->iv_ptr. The
// end-to-end check is by hand against a 3.2 build (Debian packages no 3.2, so no test Ruby or coredump case has one).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "fake_memory.h"
#include "synthetic_objects.h"
#include "stacks/symbolizer.h"

namespace rvbpfd {
namespace {

using testing::FakeMemory;
using testing::SyntheticObjects;

constexpr uint64_t kHeap = 0x900000;
constexpr uint64_t kTClass = 0x02;
constexpr uint64_t kFlSingleton = 0x1000;
constexpr uint32_t kRootParent = 0xffffffff;  // INVALID_SHAPE_ID
constexpr uint8_t kShapeRoot = 0, kShapeIvar = 1, kShapeCapacityChange = 3;

class Symbolizer32Test : public ::testing::Test {
 protected:
  void SetUp() override {
    auto o = RubyOffsets::ForVersion(3, 2);
    ASSERT_TRUE(o.ok()) << o.error().ToString();
    off_ = o.value();
    ASSERT_NE(off_.klass_ext_inline, 0u);
    mem_.Map(kHeap, 0x100000);
    gsym_ = Alloc(32);
    vm_ptr_ = Alloc(8);
    vm_ = Alloc(512);
    shapes_ = Alloc(off_.shape_size * kShapes);
    mem_.Put64(vm_ptr_, vm_);
    mem_.Put64(vm_ + off_.vm_shape_list, shapes_);
    mem_.Put32(vm_ + off_.vm_next_shape_id, kShapes);
    Shape(0, kRootParent, 0, kShapeRoot, 0);
    BuildIdTable();
  }
  uint64_t Alloc(size_t n) { return obj_.Alloc(n); }
  // 3.2 (RVARGC) strings: the length at +16, the bytes embedded at +24 or behind a pointer there.
  uint64_t String(const std::string& s) {
    uint64_t str = Alloc(24 + s.size() + 1);
    mem_.Put64(str, 0x05);
    mem_.Put64(str + 16, s.size());
    if (!s.empty()) mem_.Put(str + 24, s.data(), s.size());
    return str;
  }
  void BuildIdTable() {
    ids_ = obj_.IdTable(off_, gsym_,
                        {{'+', "+"},
                         {kSerialClasspath, "__classpath__"},
                         {kSerialTmpClasspath, "__tmp_classpath__"},
                         {kSerialAttached, "__attached__"},
                         {kSerialIvar, "@count"},
                         {kSerialMethod, "work"}},
                        [&](const std::string& name) { return String(name); });
  }
  static uint64_t Id(uint64_t serial) { return SyntheticObjects::Id(serial); }
  void Shape(uint32_t id, uint32_t parent, uint64_t edge_name, uint8_t type, uint32_t next_iv_index) {
    const uint64_t s = shapes_ + uint64_t{id} * off_.shape_size;
    mem_.Put64(s + off_.shape_edge_name, edge_name);
    mem_.Put32(s + off_.shape_next_iv_index, next_iv_index);
    mem_.Put(s + off_.shape_type, &type, 1);
    mem_.Put32(s + off_.shape_parent_id, parent);
  }
  // A class of shape `shape_id` whose ivar values are `ivars` (iv_ptr in the classext that follows RClass).
  uint64_t Class(uint32_t shape_id, const std::vector<uint64_t>& ivars, uint64_t extra_flags = 0) {
    uint64_t klass = Alloc(off_.klass_ext_inline + 64), ivptr = Alloc(8 * ivars.size() + 8);
    mem_.Put64(klass, kTClass | extra_flags | (uint64_t{shape_id} << 32));
    mem_.Put64(klass + off_.klass_ext_inline + off_.classext_iv_ptr, ivptr);
    for (size_t i = 0; i < ivars.size(); i++) mem_.Put64(ivptr + 8 * i, ivars[i]);
    return klass;
  }
  rv_ruby_frame CfuncFrame(uint64_t klass) { return obj_.CfuncFrame(off_, klass, Id(kSerialMethod)); }
  std::string Label(uint64_t klass, uint64_t vm_ptr) {
    Symbolizer sym(&mem_, off_, gsym_, vm_ptr);
    SymbolizedFrame s = sym.Symbolize(CfuncFrame(klass));
    return s.full_label.value_or("(nil)");
  }

  static constexpr uint32_t kShapes = 16;
  static constexpr uint64_t kSerialClasspath = 200, kSerialTmpClasspath = 201, kSerialAttached = 202;
  static constexpr uint64_t kSerialIvar = 300, kSerialMethod = 550;
  FakeMemory mem_;
  RubyOffsets off_;
  SyntheticObjects obj_{&mem_, kHeap + 0x10};
  uint64_t gsym_ = 0, ids_ = 0, vm_ptr_ = 0, vm_ = 0, shapes_ = 0;
};

TEST_F(Symbolizer32Test, ClassPathFromTheShapeChain) {
  // root -> @count (index 0) -> capacity change -> __tmp_classpath__ (1) -> __classpath__ (2).
  Shape(1, 0, Id(kSerialIvar), kShapeIvar, 1);
  Shape(2, 1, 0, kShapeCapacityChange, 1);
  Shape(3, 2, Id(kSerialTmpClasspath), kShapeIvar, 2);
  Shape(4, 3, Id(kSerialClasspath), kShapeIvar, 3);
  // The permanent path wins; with only the temporary one, that one is the path.
  EXPECT_EQ(Label(Class(4, {0x03, String("Tmp"), String("Foo::Bar")}), vm_ptr_), "Foo::Bar#work");
  EXPECT_EQ(Label(Class(3, {0x03, String("#<Class:0x0000000000001000>::Inner")}), vm_ptr_),
            "#<Class:0x0000000000001000>::Inner#work");
  // No path ivar on the chain: an anonymous class.
  const uint64_t anon = Class(1, {0x03});
  EXPECT_EQ(Label(anon, vm_ptr_), "#<Class:" + RubyPointerString(anon) + ">#work");
}

TEST_F(Symbolizer32Test, SingletonMethodsReadTheAttachedObject) {
  Shape(1, 0, Id(kSerialClasspath), kShapeIvar, 1);
  Shape(5, 0, Id(kSerialAttached), kShapeIvar, 1);
  const uint64_t foo = Class(1, {String("Foo")});
  EXPECT_EQ(Label(Class(5, {foo}, kFlSingleton), vm_ptr_), "Foo.work");
  // A singleton class without __attached__ is corrupt: unresolved, never a guess.
  Symbolizer sym(&mem_, off_, gsym_, vm_ptr_);
  EXPECT_FALSE(sym.Symbolize(CfuncFrame(Class(1, {String("Foo")}, kFlSingleton))).resolved);
}

TEST_F(Symbolizer32Test, CorruptShapesAreUnresolvedNotFollowed) {
  Shape(1, 0, Id(kSerialClasspath), kShapeIvar, 1);
  Symbolizer sym(&mem_, off_, gsym_, vm_ptr_);
  // A shape id the VM has not handed out.
  EXPECT_FALSE(sym.Symbolize(CfuncFrame(Class(kShapes + 3, {String("Foo")}))).resolved);
  // A cycle: bounded, then unresolved.
  Shape(6, 7, Id(kSerialIvar), kShapeIvar, 1);
  Shape(7, 6, Id(kSerialIvar), kShapeIvar, 1);
  EXPECT_FALSE(sym.Symbolize(CfuncFrame(Class(6, {0x03}))).resolved);
  // An index past any class's ivars, and an ivar list that is not there.
  Shape(8, 0, Id(kSerialClasspath), kShapeIvar, 5000);
  EXPECT_FALSE(sym.Symbolize(CfuncFrame(Class(8, {String("Foo")}))).resolved);
  const uint64_t no_ivptr = Class(1, {String("Foo")});
  mem_.Put64(no_ivptr + off_.klass_ext_inline + off_.classext_iv_ptr, 0);
  EXPECT_FALSE(sym.Symbolize(CfuncFrame(no_ivptr)).resolved);
  // Well-formed, but the symbolizer was not told where ruby_current_vm_ptr is.
  const SymbolizedFrame no_vm = Symbolizer(&mem_, off_, gsym_, 0).Symbolize(CfuncFrame(Class(1, {String("Foo")})));
  EXPECT_FALSE(no_vm.resolved);
  EXPECT_EQ(no_vm.full_label->rfind("<unresolved cfunc class", 0), 0u) << *no_vm.full_label;
  // The same class with it resolves.
  EXPECT_EQ(Label(Class(1, {String("Foo")}), vm_ptr_), "Foo#work");
}

}  // namespace
}  // namespace rvbpfd
