// Hand-rolled JSON formatting for the writer's hot path (a general JSON library allocates a tree per line, which
// costs more than the whole per-event budget of 1 microsecond). Only what .rvtrace lines need: strings, unsigned
// integers, fixed-point doubles.
#ifndef RVBPFD_SRC_TRACE_JSON_FORMAT_H_
#define RVBPFD_SRC_TRACE_JSON_FORMAT_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace rvbpfd {

// Appends `s` as a quoted JSON string. Escapes '"', '\\' and control characters; bytes that are not valid UTF-8
// (JSON text must be UTF-8, and command lines or reasons can hold anything) become U+FFFD.
void AppendJsonString(std::string* out, std::string_view s);
void AppendUint(std::string* out, uint64_t value);
// Fixed notation with `decimals` digits after the point; non-finite values are written as null (JSON has no NaN).
void AppendFixed(std::string* out, double value, int decimals);
// Shortest representation that reads back to the same double; non-finite values are written as null.
void AppendDouble(std::string* out, double value);
// Appends "0x<lower-case hex>" with the quotes: pointers are written as strings, since JSON numbers above 2^53 lose
// precision in most readers.
void AppendHexString(std::string* out, uint64_t value);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_TRACE_JSON_FORMAT_H_
