// Parsing and validation of cluster topologies: bandwidths and memory sizes with units, the
// `COUNT:BANDWIDTH` level syntax of the command line, and the JSON form
//   {"levels": [{"count": 8, "bandwidth": "300GB/s"}, {"count": 4, "bandwidth": "25Gbit/s"}],
//    "memory_per_worker": "80GiB"}
// (levels innermost first; a bandwidth or size may also be a plain number of bytes(/s)).
//
// Units: decimal B, KB, MB, GB, TB (powers of 1000), binary KiB, MiB, GiB, TiB (powers of 1024),
// and for bandwidths bit, Kbit, Mbit, Gbit, Tbit (divided by 8), each optionally followed by
// "/s" ("ps" for bits: "25Gbps"). Anything unparsable, zero, negative or not finite is a
// ConfigError naming the text and what is accepted.
#pragma once

#include <pipeline/plan/topology.hpp>

#include <nlohmann/json_fwd.hpp>

#include <string>
#include <string_view>

namespace pipeline {

double parse_bandwidth(std::string_view text);  // bytes per second
double parse_bytes(std::string_view text);      // bytes
TopologyLevel parse_level(std::string_view text);  // "4:1e10", "8:300GB/s"

// Throws ConfigError when the topology has no levels, a count below 1, a bandwidth that is not
// positive, or a memory that is not positive.
void validate_topology(const Topology& topology);

Topology topology_from_json(const nlohmann::json& j, std::string_view origin);
nlohmann::json topology_to_json(const Topology& topology);
// Parses the JSON text of a topology; `origin` names it in error messages.
Topology parse_topology(std::string_view text, std::string_view origin);
Topology read_topology(const std::string& path);

// "8x300 GB/s, 4x25 Gbit/s, 80 GiB per worker" style summary for logs and tables.
std::string describe_topology(const Topology& topology);

}  // namespace pipeline
