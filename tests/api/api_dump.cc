// Dumps the halka.v1 API surface from a FileDescriptorSet (protoc
// --descriptor_set_out --include_imports) as sorted canonical lines, one
// per message, field, enum, enum value, service and method:
//
//   message halka.v1.Member in halka/v1/common.proto
//   field halka.v1.Member.rank = 1 int32 singular
//   field halka.v1.OpSpec.x = 9 halka.v1.DType repeated oneof=choice
//   enum_value halka.v1.DType.FLOAT32 = 1
//   method halka.v1.Worker.Session (halka.v1.SessionOffer) returns (stream halka.v1.SessionEvent)
//
// tests/api/api_check.sh compares them with the committed baseline: a line
// that disappears is a breaking change (buf's FILE and WIRE rules: a field
// removed, renumbered, renamed, retyped or relabelled, a message, enum
// value or method removed, a method's types or streaming changed).
//
//   halka_api_dump DESCRIPTOR_SET [PACKAGE_PREFIX (default halka.v1)]
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"

namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumDescriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::FileDescriptor;
using google::protobuf::ServiceDescriptor;

std::string FieldType(const FieldDescriptor& f) {
  if (f.message_type() != nullptr) return f.message_type()->full_name();
  if (f.enum_type() != nullptr) return f.enum_type()->full_name();
  return f.type_name();
}

std::string FieldLabel(const FieldDescriptor& f) {
  if (f.is_repeated()) return "repeated";
  if (f.is_required()) return "required";
  if (f.has_optional_keyword()) return "optional";
  return "singular";
}

void DumpEnum(const EnumDescriptor& e, std::vector<std::string>* out) {
  out->push_back("enum " + e.full_name() + " in " + e.file()->name());
  for (int i = 0; i < e.value_count(); ++i) {
    // Under its enum's name (a value's own full name is its enum's
    // sibling's).
    out->push_back("enum_value " + e.full_name() + "." + e.value(i)->name() +
                   " = " + std::to_string(e.value(i)->number()));
  }
}

void DumpMessage(const Descriptor& m, std::vector<std::string>* out) {
  out->push_back("message " + m.full_name() + " in " + m.file()->name());
  for (int i = 0; i < m.field_count(); ++i) {
    const FieldDescriptor& f = *m.field(i);
    std::string line = "field " + f.full_name() + " = " +
                       std::to_string(f.number()) + " " + FieldType(f) + " " +
                       FieldLabel(f);
    if (f.real_containing_oneof() != nullptr) {
      line += " oneof=" + f.real_containing_oneof()->name();
    }
    out->push_back(line);
  }
  for (int i = 0; i < m.nested_type_count(); ++i) {
    DumpMessage(*m.nested_type(i), out);
  }
  for (int i = 0; i < m.enum_type_count(); ++i) DumpEnum(*m.enum_type(i), out);
}

void DumpService(const ServiceDescriptor& s, std::vector<std::string>* out) {
  out->push_back("service " + s.full_name() + " in " + s.file()->name());
  for (int i = 0; i < s.method_count(); ++i) {
    const auto& m = *s.method(i);
    out->push_back("method " + m.full_name() + " (" +
                   (m.client_streaming() ? "stream " : "") +
                   m.input_type()->full_name() + ") returns (" +
                   (m.server_streaming() ? "stream " : "") +
                   m.output_type()->full_name() + ")");
  }
}

void DumpFile(const FileDescriptor& f, std::vector<std::string>* out) {
  for (int i = 0; i < f.message_type_count(); ++i) {
    DumpMessage(*f.message_type(i), out);
  }
  for (int i = 0; i < f.enum_type_count(); ++i) DumpEnum(*f.enum_type(i), out);
  for (int i = 0; i < f.service_count(); ++i) DumpService(*f.service(i), out);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: %s DESCRIPTOR_SET [PACKAGE_PREFIX]\n",
                 argv[0]);
    return 2;
  }
  const std::string prefix = argc == 3 ? argv[2] : "halka.v1";
  google::protobuf::FileDescriptorSet set;
  std::ifstream in(argv[1], std::ios::binary);
  if (!in || !set.ParseFromIstream(&in)) {
    std::fprintf(stderr, "cannot read a FileDescriptorSet from %s\n", argv[1]);
    return 2;
  }
  // --include_imports lists every file after the files it imports.
  google::protobuf::DescriptorPool pool;
  std::vector<const FileDescriptor*> files;
  for (const auto& proto : set.file()) {
    const FileDescriptor* f = pool.BuildFile(proto);
    if (f == nullptr) {
      std::fprintf(stderr, "cannot build %s\n", proto.name().c_str());
      return 2;
    }
    if (f->package() == prefix || f->package().rfind(prefix + ".", 0) == 0) {
      files.push_back(f);
    }
  }
  if (files.empty()) {
    std::fprintf(stderr, "no file of package %s in %s\n", prefix.c_str(),
                 argv[1]);
    return 2;
  }
  std::vector<std::string> lines;
  for (const FileDescriptor* f : files) DumpFile(*f, &lines);
  std::sort(lines.begin(), lines.end());
  for (const std::string& l : lines) std::printf("%s\n", l.c_str());
  return 0;
}
