// serving_metrics.cpp: TTFT and TPOT percentiles over requests (see serving_metrics.h).
#include "01_sequence/cli/serving_metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace nanovllm {

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(values.begin(), values.end());
  const double rank = p / 100 * double(values.size() - 1);
  const size_t below = size_t(std::floor(rank)), above = std::min(below + 1, values.size() - 1);
  return values[below] + (rank - double(below)) * (values[above] - values[below]);
}

ServingMetrics serving_metrics(const std::vector<RequestTiming>& requests) {
  std::vector<double> ttft, tpot;
  for (const RequestTiming& r : requests) {
    ttft.push_back(r.first_token - r.arrival);
    // One output token has no time per output token: it is all time to first token.
    if (r.output_tokens > 1) tpot.push_back((r.finished - r.first_token) / (r.output_tokens - 1));
  }
  ServingMetrics m;
  m.requests = int(ttft.size());
  m.ttft_median = percentile(ttft, 50);
  m.ttft_p99 = percentile(ttft, 99);
  m.tpot_requests = int(tpot.size());
  m.tpot_median = percentile(tpot, 50);
  m.tpot_p99 = percentile(tpot, 99);
  return m;
}

}  // namespace nanovllm
