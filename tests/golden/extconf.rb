# frozen_string_literal: true
# Builds the golden-frame recorder `rvgolden` (ground truth for rvbpfd's Ruby stack walker and symbolizer).
#
#   mkdir build && cd build && <ruby> /path/to/tests/golden/extconf.rb && make
#   <ruby> -I build -rrvgolden program.rb      # the program calls RvGolden.capture(path, stop)
#
# rb_profile_thread_frames (frames of another thread) exists from CRuby 3.3.
require "mkmf"

abort "rvgolden: CRuby 3.3+ is required (this is #{RUBY_VERSION})" if Gem::Version.new(RUBY_VERSION) < Gem::Version.new("3.3")
have_func("rb_profile_thread_frames", "ruby/debug.h") or abort "rvgolden: no rb_profile_thread_frames"
$CFLAGS << " -std=gnu11 -Wall -Wextra -Wno-unused-parameter"
create_makefile("rvgolden")
