// `relaybus-mongo handler create | alter | drop`: the catalog rules of
// PostgreSQL's relay_create_handler / relay_alter_handler / relay_drop_handler
// over relay_handlers (docs/mongo.md, "Handlers").
#pragma once

#include <optional>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "mongo/store.hpp"

namespace relaybus::mongo {

// Refused input or a refused operation (exit code 2), with the message to print.
struct BadInput : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Creates a handler; an existing name is refused ("already exists").
nlohmann::json handler_create(Store& store, const std::string& name, const std::string& kind, const std::string& target,
                              const std::string& options_json);

// Changes the target and/or merges options into the stored ones (a key set to
// null restores its default), validated as at creation. The kind stays.
nlohmann::json handler_alter(Store& store, const std::string& name, const std::optional<std::string>& target,
                             const std::optional<std::string>& options_json);

// Drops a handler and its routes. Pending deliveries refuse the drop unless
// force; forced, they are dead-lettered ("handler dropped"), never left behind.
nlohmann::json handler_drop(Store& store, const std::string& name, bool force, int64_t now_ms);

// stored merged with changes (both JSON objects; null in changes removes the
// key). false with *why when either is not a JSON object.
bool merge_options(const std::string& stored, const std::string& changes, std::string* merged, std::string* why);

}  // namespace relaybus::mongo
