// serving_metrics.h: what a serving user reads, from the times of each request (`nanovllm bench`; vLLM's
// benchmarks/benchmark_serving.py reports the same). Per request, in seconds:
//   TTFT, time to first token  = first_token - arrival
//   TPOT, time per output token = (finished - first_token) / (output_tokens - 1), only for requests with
//                                 more than one output token (the decode rate once the first one is out)
// then the median and the 99th percentile of each over the requests. In bench.py every request arrives
// at t = 0 (all are queued before the first step), so TTFT includes the wait behind earlier prefills.
#pragma once

#include <vector>

namespace nanovllm {

// One finished request: when it arrived, got its first output token and finished (seconds, any common
// origin), and how many tokens it output.
struct RequestTiming {
  double arrival = 0, first_token = 0, finished = 0;
  int output_tokens = 0;
};

struct ServingMetrics {
  int requests = 0;                      // requests in TTFT
  double ttft_median = 0, ttft_p99 = 0;  // seconds
  int tpot_requests = 0;                 // requests in TPOT (more than one output token)
  double tpot_median = 0, tpot_p99 = 0;  // seconds; NaN when tpot_requests is 0
};

// The p-th percentile (0 <= p <= 100) of `values`, interpolated linearly between the two nearest ranks,
// as numpy.percentile does by default (what vLLM's benchmark uses): sorted v of n values, rank
// r = p / 100 * (n - 1), result v[floor(r)] + (r - floor(r)) * (v[floor(r) + 1] - v[floor(r)]).
// NaN for no values.
double percentile(std::vector<double> values, double p);

// TTFT and TPOT over `requests` (NaN medians and percentiles where there is nothing to take them of).
ServingMetrics serving_metrics(const std::vector<RequestTiming>& requests);

}  // namespace nanovllm
