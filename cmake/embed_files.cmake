# Embeds files into the binary, byte for byte, as std::string_view constants in a generated C++ source:
#   cmake -P embed_files.cmake -- OUT.cc HEADER NAME FILE [NAME FILE]...
# writes OUT.cc, which includes HEADER (the committed header that declares each NAME as
# `extern const std::string_view NAME;` in namespace rvbpfd) and defines NAME as the bytes of FILE.
# Every byte is written as a \xNN escape, so no content (quotes, backslashes, ")delim\"", non-ASCII, NUL) can change
# the literal. The source is written to OUT.cc.tmp and renamed into place, so a compiler never reads half of it.
cmake_minimum_required(VERSION 3.20)

set(args)
set(seen_separator FALSE)
math(EXPR last "${CMAKE_ARGC} - 1")
foreach(i RANGE ${last})
  if(seen_separator)
    list(APPEND args "${CMAKE_ARGV${i}}")
  elseif(CMAKE_ARGV${i} STREQUAL "--")
    set(seen_separator TRUE)
  endif()
endforeach()
list(LENGTH args nargs)
math(EXPR npairs "(${nargs} - 2) / 2")
math(EXPR rest "(${nargs} - 2) % 2")
if(nargs LESS 4 OR NOT rest EQUAL 0)
  message(FATAL_ERROR "embed_files.cmake: usage: cmake -P embed_files.cmake -- OUT.cc HEADER NAME FILE [NAME FILE]...")
endif()
list(GET args 0 out)
list(GET args 1 header)

# 32 bytes (64 hex digits) per source line.
string(REPEAT "." 64 line_pattern)
set(body "")
set(inputs "")
math(EXPR last_pair "${npairs} - 1")
foreach(p RANGE ${last_pair})
  math(EXPR ni "2 + 2 * ${p}")
  math(EXPR fi "3 + 2 * ${p}")
  list(GET args ${ni} name)
  list(GET args ${fi} file)
  if(NOT EXISTS "${file}")
    message(FATAL_ERROR "embed_files.cmake: ${file} does not exist")
  endif()
  file(READ "${file}" hex HEX)
  string(LENGTH "${hex}" hex_len)
  math(EXPR size "${hex_len} / 2")
  string(REGEX REPLACE "(${line_pattern})" "\\1\n" hex "${hex}")
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "\\\\x\\1" escaped "${hex}")
  string(REGEX REPLACE "\n$" "" escaped "${escaped}")
  string(REPLACE "\n" "\"\n    \"" escaped "${escaped}")
  get_filename_component(file_name "${file}" NAME)
  string(APPEND inputs " ${file_name}")
  string(APPEND body "// ${file_name} (${size} bytes)\nconst std::string_view ${name}(\n    \"${escaped}\",\n    ${size});\n\n")
endforeach()

file(WRITE "${out}.tmp"
     "// Generated at build time by cmake/embed_files.cmake; edit the embedded files:${inputs}.\n"
     "#include \"${header}\"\n\nnamespace rvbpfd {\n\n${body}}  // namespace rvbpfd\n")
file(RENAME "${out}.tmp" "${out}")
