#!/usr/bin/env python3
"""Checks docs/architecture.md against the tree and the build.

  architecture_check.py SOURCE_DIR BUILD_DIR

Fails (exit 1, one line per problem) when:
  - a build target the page's table names does not exist, or a halka
    library or program of the build is missing from the table;
  - a source file (proto/, common/, core/, seal/, codec/, transport/,
    worker/, server/, client/, bench/) is missing from the page's source tree, or the tree names a
    file that is not there;
  - the engine (core/) includes anything beyond itself, the public
    vocabulary, the shared-memory helpers, Abseil, OpenSSL's crypto
    header and the C/C++ libraries: no gRPC, no generated protos, no
    link kinds, no daemon code;
  - a layer includes a layer above it: seal/ includes only itself, Abseil
    and OpenSSL; codec/ nothing of transport/, worker/, server/ or
    client/; transport/ nothing of worker/, server/ or client/ (and
    transport/<kind>/ nothing of another kind's folder but the wire's
    shared-memory fallback: the chooser lives in transport/link_path.h);
    common/ nothing of core/ and above.
"""
import os
import re
import subprocess
import sys

SRC, BUILD = sys.argv[1], sys.argv[2]
DOC = os.path.join(SRC, "docs", "architecture.md")
problems = []


def tracked_sources():
    out = subprocess.run(["git", "-C", SRC, "ls-files"], capture_output=True,
                         text=True, check=True).stdout.split()
    roots = ("proto/", "common/", "core/", "seal/", "codec/", "transport/",
             "worker/", "server/", "client/", "bench/")
    exts = (".h", ".cc", ".cu", ".proto", ".py")
    return [f for f in out if f.startswith(roots) and f.endswith(exts)
            and "/tests/" not in f and os.path.exists(os.path.join(SRC, f))]


def doc_mentions(doc, path):
    base, ext = os.path.splitext(path)
    if path in doc or base + ".{" in doc or base + "." in doc:
        return True
    d, name = os.path.split(path)
    # A folder line and its files listed by name below it ("ring.cc, naive.cc").
    return (d + "/") in doc and re.search(r"\b" + re.escape(name) + r"\b", doc)


def check_tree(doc):
    for f in tracked_sources():
        if not doc_mentions(doc, f):
            problems.append(f"source tree: {f} is not on the page")
    for m in re.finditer(r"^((?:proto|common|core|seal|codec|transport|worker|server|client|bench)/"
                         r"[\w/.{},-]+)", doc, re.M):
        entry = m.group(1).rstrip("/")
        brace = re.match(r"(.*)\.\{([\w,]+)\}$", entry)
        paths = ([f"{brace.group(1)}.{e}" for e in brace.group(2).split(",")]
                 if brace else [entry])
        for p in paths:
            if "*" in p:
                continue
            if not os.path.exists(os.path.join(SRC, p)):
                problems.append(f"source tree: the page names {p}, which is not there")


def build_targets():
    out = subprocess.run(["ninja", "-C", BUILD, "-t", "targets", "all"],
                         capture_output=True, text=True, check=True).stdout
    names = set()
    for line in out.splitlines():
        name = line.split(":")[0]
        if re.fullmatch(r"halka[\w-]*", name) and line.endswith("phony"):
            names.add(name)
    return names


def check_targets(doc):
    table = doc.split("## Build targets", 1)[-1].split("## Target graph", 1)[0]
    rows = [r for r in table.splitlines() if r.startswith("| `")]
    named = set()
    interface = set()
    for r in rows:
        first = r.split("|")[1]
        if "(interface)" in first:  # no build rule of its own to find
            interface.update("halka_" + t[len("halka::"):]
                             for t in re.findall(r"`(halka::\w+)", first))
        for t in re.findall(r"`([^`]+)`", first):
            t = t.split(" ")[0]
            named.add("halka_" + t[len("halka::"):] if t.startswith("halka::") else t)
    built = build_targets()
    optional = {"halka_cuda_reduce_bench", "halka_cuda_reduce_ptx",
                "halka_python"}  # only with CUDA / Python found
    for t in sorted(named - built - optional - interface):
        problems.append(f"targets: the page lists {t}, which the build does not have")
    for t in sorted(built - named):
        problems.append(f"targets: the build has {t}, which the page's table does not list")


ALLOWED_CORE = re.compile(
    r'^(core/|halka/types\.h$|common/held_shm\.h$|common/shm_guard\.h$|'
    r'common/clock\.h$|'
    r'absl/|openssl/crypto\.h$|gtest/|cuda|thrust/|cub/)')


def includes(folder):
    """(relative path, line number, included name) of every quoted include."""
    for dirpath, _, files in os.walk(os.path.join(SRC, folder)):
        for f in sorted(files):
            if not f.endswith((".h", ".cc", ".cu")):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, SRC)
            for n, line in enumerate(open(path, encoding="utf-8"), 1):
                m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                if m:
                    yield rel, n, m.group(1)


def check_core_includes():
    for rel, n, inc in includes("core"):
        if not ALLOWED_CORE.match(inc):
            problems.append(f"layers: {rel}:{n} includes {inc} "
                            "(the engine includes no gRPC, proto, link "
                            "or daemon header)")


# folder -> (what its files may not include, why)
FORBIDDEN = {
    "common": (re.compile(r"^(core|seal|codec|transport|worker|server|client)/"),
               "common/ is below every other layer"),
    "seal": (re.compile(r"^(?!seal/|absl/|openssl/)"),
             "the seal links only Abseil and libcrypto"),
    "codec": (re.compile(r"^(transport|worker|server|client)/"),
              "the codecs sit below the transport and the daemons"),
    "transport": (re.compile(r"^(worker|server|client)/"),
                  "the transport knows no node, service or SDK"),
    "transport/grpc": (re.compile(r"^transport/(tcp|shm)/(?!wire_link\.h$|shm_link\.h$)"),
                       "the gRPC path reaches the others through their headers only"),
    "transport/shm": (re.compile(r"^transport/(grpc|tcp)/"),
                      "the shared-memory path knows no other kind"),
}


def check_layers():
    for folder, (bad, why) in FORBIDDEN.items():
        for rel, n, inc in includes(folder):
            if bad.search(inc) and not inc.startswith(("halka/", "gtest/")) \
                    and (folder != "seal" or "/" in inc):
                problems.append(f"layers: {rel}:{n} includes {inc} ({why})")


doc = open(DOC, encoding="utf-8").read()
check_tree(doc)
check_targets(doc)
check_core_includes()
check_layers()
for p in problems:
    print(p)
if problems:
    print(f"architecture_check: {len(problems)} problem(s); docs/architecture.md "
          "and the tree disagree")
    sys.exit(1)
print("architecture_check: docs/architecture.md matches the tree, the targets "
      "and the engine's include rule")
