# frozen_string_literal: true
# Builds the golden-frame recorder `rvgolden` (ground truth for rvbpfd's Ruby stack walker and symbolizer).
#
#   mkdir build && cd build && <ruby> /path/to/tests/golden/extconf.rb && make
#   <ruby> -I build -rrvgolden program.rb      # the program calls RvGolden.capture(path, stop)
#
# rb_profile_thread_frames (frames of another thread) exists from CRuby 3.3. Older Rubies whose libruby exports the
# thread-local ruby_current_ec (Debian's 3.1) get RVGOLDEN_EC_SWAP instead: rb_profile_frames on each thread's EC.
require "mkmf"

unless have_func("rb_profile_thread_frames", "ruby/debug.h")
  ec_swap = Gem::Version.new(RUBY_VERSION) >= Gem::Version.new("3.1") && try_link(<<~C)
    extern __thread void *ruby_current_ec;
    int main(void) { return ruby_current_ec != 0; }
  C
  abort "rvgolden: no rb_profile_thread_frames and no exported ruby_current_ec in #{RUBY_VERSION}" unless ec_swap
  $defs << "-DRVGOLDEN_EC_SWAP"
end
$CFLAGS << " -std=gnu11 -Wall -Wextra -Wno-unused-parameter"
create_makefile("rvgolden")
