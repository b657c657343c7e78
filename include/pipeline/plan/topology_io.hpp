// Parsing and validation of cluster topologies: bandwidths and memory sizes with units, the
// `COUNT:BANDWIDTH` level syntax of the command line, and the JSON form
//   {"levels": [{"count": 8, "bandwidth": "300GB/s"}, {"count": 4, "bandwidth": "25Gbit/s"}],
//    "memory_per_worker": "80GiB"}
// (levels innermost first; a bandwidth or size may also be a plain number of bytes(/s)).
//
// Prices and worker types (both optional; files without them load as before):
//   {"levels": [{"count": 24, "bandwidth": "25Gbit/s"}],
//    "price_per_worker_hour": 2.0,
//    "types": [{"name": "h100", "count": 8, "memory_per_worker": "80GiB",
//    "price_per_worker_hour": 4.5},
//              {"name": "a100", "count": 16, "memory_per_worker": "40GiB",
//              "price_per_worker_hour": 1.9}]}
// A type without memory or price takes the top-level one. With types there is exactly one level
// and its count is the types' total (topology.hpp says why).
//
// Units: decimal B, KB, MB, GB, TB (powers of 1000), binary KiB, MiB, GiB, TiB (powers of 1024),
// and for bandwidths bit, Kbit, Mbit, Gbit, Tbit (divided by 8), each optionally followed by
// "/s" or "ps". Case does not matter except for one letter: in a bandwidth a lower-case b is a bit
// and an upper-case B a byte, as network speeds are written ("25Gb/s" and "25Gbps" are 25 Gbit/s,
// "25GB/s" and "25GBps" 25 GB/s). Anything unparsable, zero, negative or not finite is a
// ConfigError naming the text and what is accepted.
#pragma once

#include <pipeline/plan/topology.hpp>

#include <nlohmann/json_fwd.hpp>

#include <cstddef>
#include <optional>

#include <string>
#include <string_view>

namespace pipeline {

double parse_bandwidth(std::string_view text);  // bytes per second
double parse_bytes(std::string_view text);      // bytes
TopologyLevel parse_level(std::string_view text);  // "4:1e10", "8:300GB/s"

// Throws ConfigError when the topology has no levels, a count below 1, a bandwidth that is not
// positive, a memory that is not positive, or a negative price; with worker types, when a name
// is empty, repeated or not [A-Za-z0-9_.-], a count is below 1, there is more than one level or
// the counts do not add up to the level's.
void validate_topology(const Topology& topology);

// A worker type's memory and price, falling back to the topology's.
std::optional<double> type_memory(const Topology& topology, std::size_t type);
std::optional<double> type_price(const Topology& topology, std::size_t type);

double parse_price(std::string_view text);  // "2.5": non-negative currency units per worker-hour
// Command-line worker type NAME:COUNT[:PRICE[:MEMORY]], e.g. "h100:8:4.5:80GiB".
WorkerType parse_worker_type(std::string_view text);

Topology topology_from_json(const nlohmann::json& j, std::string_view origin);
nlohmann::json topology_to_json(const Topology& topology);
// Parses the JSON text of a topology; `origin` names it in error messages.
Topology parse_topology(std::string_view text, std::string_view origin);
Topology read_topology(const std::string& path);

// "8x300 GB/s, 4x25 Gbit/s, 80 GiB per worker" style summary for logs and tables.
std::string describe_topology(const Topology& topology);

}  // namespace pipeline
