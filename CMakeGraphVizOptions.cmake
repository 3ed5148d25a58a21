# Options for `cmake --graphviz` (docs/architecture.md draws the target graph
# with it): halka's own libraries and programs only. External libraries
# (Abseil, gRPC, protobuf, CUDA, OpenSSL...), the tests and the per-target
# files are left out.
set(GRAPHVIZ_GRAPH_NAME "halka")
set(GRAPHVIZ_EXTERNAL_LIBS FALSE)
set(GRAPHVIZ_GENERATE_PER_TARGET FALSE)
set(GRAPHVIZ_GENERATE_DEPENDERS FALSE)
set(GRAPHVIZ_IGNORE_TARGETS
  "_test$" "^halka-fault-driver$" "^halka_make_corpus$" "_fuzz$")
