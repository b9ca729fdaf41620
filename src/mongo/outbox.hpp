// The outbox: what an application writes to publish (docs/mongo.md, "The outbox").
//
//   relay_outbox  {_id: any (an ObjectId by default), topic, payload, key?, headers?,
//                  priority?, not_before?, dedupe_key?}
//
// An application needs insert on relay_outbox and nothing else. The sequencer
// (sequencer.hpp) is its only reader: it turns each document into an event
// (id, key seq, lane) and its deliveries, then removes it.
#pragma once

#include <bson/bson.h>

#include <cstdint>
#include <optional>
#include <string>

namespace relaybus::mongo {

constexpr const char* kOutbox = "relay_outbox";
constexpr const char* kSequence = "relay_sequence";             // the sequencer's journal (versions)
constexpr const char* kDedupe = "relay_dedupe";                 // {_id: dedupe_key, event_id, outbox_id, at}
constexpr const char* kOutboxRejects = "relay_outbox_rejects";  // malformed outbox documents + error

// An outbox document as the sequencer understands it.
struct OutboxEntry {
  std::string id_json;  // the _id as relaxed extended JSON: a map key
  std::string topic;
  bool has_key = false;
  std::string key;
  int priority = 1;
  bool has_not_before = false;
  int64_t not_before_ms = 0;
  std::string dedupe_key;  // empty: none
  std::string malformed;   // why it cannot become an event; empty = fine
};

OutboxEntry parse_outbox_doc(const bson_t* doc, int max_key_bytes);

// What `relaybus-mongo publish` inserts (fields as an application would).
struct OutboxMessage {
  std::string topic;
  std::string payload_json;
  std::optional<std::string> key;
  std::string headers_json;  // empty: none
  std::optional<int> priority;
  int64_t not_before_ms = 0;  // 0: none
  std::string dedupe_key;     // empty: none
};

// Builds the document with a fresh ObjectId _id (returned as hex in *oid_hex).
// false with *why if the payload or headers cannot be stored as BSON.
bool build_outbox_doc(const OutboxMessage& m, bson_t* out, std::string* oid_hex, std::string* why);

}  // namespace relaybus::mongo
