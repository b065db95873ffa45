// A record ring in private memory, with both ends attached, for tests of the ring and of the
// codec that writes records into it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "freeflow/ring.h"

namespace ff {

struct TestRing {
  explicit TestRing(uint32_t bytes) : mem(sizeof(RingHeader) + bytes + kCacheLine), size(bytes) {
    void* p = mem.data();
    size_t space = mem.size();
    header = new (std::align(kCacheLine, sizeof(RingHeader) + bytes, p, space)) RingHeader();
    producer.Attach(header, bytes);
    consumer.Attach(header, bytes);
  }
  std::vector<char> mem;
  uint32_t size;
  RingHeader* header;
  RingProducer producer;
  RingConsumer consumer;
};

}  // namespace ff
