#include "common/prometheus.h"

#include "common/http_server.h"

namespace halka {

void PrometheusWriter::Family(absl::string_view name, absl::string_view type,
                              absl::string_view help) {
  if (index_.count(name) != 0) return;
  index_.emplace(std::string(name), families_.size());
  families_.push_back(FamilyText{
      absl::StrCat("# HELP ", name, " ", help, "\n# TYPE ", name, " ", type,
                   "\n"),
      ""});
}

PrometheusWriter::FamilyText& PrometheusWriter::Find(absl::string_view name) {
  auto it = index_.find(name);
  if (it == index_.end()) {
    it = index_.emplace(std::string(name), families_.size()).first;
    families_.emplace_back();
  }
  return families_[it->second];
}

void PrometheusWriter::AppendSample(std::string* out, absl::string_view name,
                                    const Labels& labels,
                                    absl::string_view extra_label,
                                    const absl::AlphaNum& value) {
  absl::StrAppend(out, name);
  if (!labels.empty() || !extra_label.empty()) {
    out->push_back('{');
    const char* sep = "";
    for (const auto& [key, v] : labels) {
      absl::StrAppend(out, sep, key, "=\"", PromEscape(v), "\"");
      sep = ",";
    }
    if (!extra_label.empty()) absl::StrAppend(out, sep, extra_label);
    out->push_back('}');
  }
  absl::StrAppend(out, " ", value, "\n");
}

void PrometheusWriter::Sample(absl::string_view name, const Labels& labels,
                              const absl::AlphaNum& value) {
  AppendSample(&Find(name).body, name, labels, "", value);
}

void PrometheusWriter::Histogram(absl::string_view name, const Labels& labels,
                                 absl::Span<const double> bounds,
                                 absl::Span<const uint64_t> bucket_counts,
                                 double sum, uint64_t count) {
  std::string* out = &Find(name).body;
  const std::string bucket = absl::StrCat(name, "_bucket");
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (i < bucket_counts.size()) cumulative += bucket_counts[i];
    AppendSample(out, bucket, labels,
                 absl::StrCat("le=\"", bounds[i], "\""), cumulative);
  }
  AppendSample(out, bucket, labels, "le=\"+Inf\"", count);
  AppendSample(out, absl::StrCat(name, "_sum"), labels, "", sum);
  AppendSample(out, absl::StrCat(name, "_count"), labels, "", count);
}

std::string PrometheusWriter::Text() const {
  std::string out;
  for (const FamilyText& f : families_) absl::StrAppend(&out, f.header, f.body);
  return out;
}

}  // namespace halka
