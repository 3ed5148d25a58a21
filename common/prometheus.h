// Prometheus text exposition format (version 0.0.4), written one way for
// every daemon.
//
//   PrometheusWriter w;
//   w.Family("halka_ring_generation", "gauge", "membership generation");
//   w.Sample("halka_ring_generation", {{"halka_job", "j"}}, 4);
//   std::string body = w.Text();
//
// Families are written in the order they were declared, each with its
// `# HELP` and `# TYPE` lines once, then its samples in the order they were
// added, so samples of several families may be added interleaved (one job
// after another). A declared family with no samples still gets its two
// header lines. Label values are escaped with PromEscape (\\, \", \n);
// names are written as given. Values are formatted as absl::StrCat formats
// them (integers in full, doubles with six significant digits).
//
// Thread-safety: none (build one per scrape).
#ifndef HALKA_COMMON_PROMETHEUS_H_
#define HALKA_COMMON_PROMETHEUS_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace halka {

class PrometheusWriter {
 public:
  using Labels = std::vector<std::pair<std::string, std::string>>;

  // Declares a family: `type` is "gauge", "counter" or "histogram". A
  // second declaration of the same name is ignored.
  void Family(absl::string_view name, absl::string_view type,
              absl::string_view help);

  // Adds `name{labels} value` to the family `name` (declared first, or
  // declared now with no HELP/TYPE if it never is).
  void Sample(absl::string_view name, const Labels& labels,
              const absl::AlphaNum& value);

  // Adds a histogram's series to family `name`: one `name_bucket` per
  // upper bound with the cumulative count and label le="<bound>", then
  // le="+Inf" (all `count` observations), `name_sum` and `name_count`.
  // `bucket_counts[i]` counts observations in (bounds[i-1], bounds[i]];
  // extra entries past bounds.size() are ignored.
  void Histogram(absl::string_view name, const Labels& labels,
                 absl::Span<const double> bounds,
                 absl::Span<const uint64_t> bucket_counts, double sum,
                 uint64_t count);

  // The exposition: every family in declaration order.
  std::string Text() const;

 private:
  struct FamilyText {
    std::string header;  // "# HELP ...\n# TYPE ...\n"
    std::string body;    // the sample lines
  };
  FamilyText& Find(absl::string_view name);
  static void AppendSample(std::string* out, absl::string_view name,
                           const Labels& labels, absl::string_view extra_label,
                           const absl::AlphaNum& value);

  std::vector<FamilyText> families_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> families_
};

}  // namespace halka

#endif  // HALKA_COMMON_PROMETHEUS_H_
