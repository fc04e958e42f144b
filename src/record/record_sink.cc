#include "record/record_sink.h"

#include <utility>

namespace rvbpfd {

Result<std::unique_ptr<TraceFileSink>> TraceFileSink::Create(const std::string& path, const TraceHeader& header,
                                                             TraceFormat format) {
  Result<TraceWriter> writer = TraceWriter::Create(path, header, format);
  if (!writer) return writer.error();
  return std::unique_ptr<TraceFileSink>(new TraceFileSink(std::move(writer.value())));
}

}  // namespace rvbpfd
