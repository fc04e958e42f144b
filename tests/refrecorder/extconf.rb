# frozen_string_literal: true
# Builds the in-process reference recorder `rvref` for the end-to-end tests.
#
#   mkdir build && cd build && <ruby> /path/to/tests/refrecorder/extconf.rb && make
#   RVREF_OUT=trace.rvtrace <ruby> -I build -rrvref script.rb
#
# The thread event hook API with event_data->thread needs CRuby 3.3+; rvref.c refuses other versions.
require "mkmf"

abort "rvref: CRuby 3.3 or 3.4 is required (this is #{RUBY_VERSION})" unless RUBY_VERSION.start_with?("3.3.", "3.4.")
have_header("ruby/thread.h") or abort "rvref: ruby/thread.h missing"
have_func("rb_internal_thread_add_event_hook", "ruby/thread.h") or abort "rvref: no rb_internal_thread_add_event_hook"
$CFLAGS << " -std=gnu11 -Wall -Wextra -Wno-unused-parameter"
create_makefile("rvref")
