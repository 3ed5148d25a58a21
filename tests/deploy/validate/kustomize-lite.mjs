// A small offline stand-in for `kubectl kustomize DIR`, for machines
// without kubectl: renders the subset of kustomize that halka's manifests
// (deploy/k8s) and the broken copies (tests/deploy/broken/k8s) use, and
// refuses anything else.
//
//   node kustomize-lite.mjs DIR              prints the rendered YAML stream
//   node kustomize-lite.mjs --compare A B    exits 1 unless the YAML streams
//                                            A and B hold the same objects
//
// Supported: resources (files and directories with a kustomization),
// patches (path or inline; strategic merge, matched by kind and name),
// labels (pairs, includeSelectors: false), images (name -> newName/newTag),
// namePrefix (with the name references halka uses). Strategic merge: maps
// merge, null deletes, lists of containers/env/volumes/volumeMounts merge
// by name and ports by containerPort/port (patched entries first, as
// kustomize writes them), other lists are replaced.
// When kubectl is present, k8s_validate_test.sh renders with both and
// compares (--compare), so this stand-in stays faithful.
import fs from "node:fs";
import path from "node:path";
import YAML from "yaml";

const SUPPORTED = new Set(["apiVersion", "kind", "resources", "patches", "labels", "images", "namePrefix"]);

function readYamlStream(file) {
  return YAML.parseAllDocuments(fs.readFileSync(file, "utf8"), { merge: true })
    .map((d) => {
      if (d.errors.length) throw new Error(`${file}: ${d.errors[0].message}`);
      return d.toJS();
    })
    .filter((o) => o !== null && o !== undefined);
}

function kustomizationFile(dir) {
  for (const n of ["kustomization.yaml", "kustomization.yml", "Kustomization"]) {
    if (fs.existsSync(path.join(dir, n))) return path.join(dir, n);
  }
  throw new Error(`${dir}: no kustomization.yaml`);
}

const mergeKey = (field, parentPath) => {
  if (["containers", "initContainers", "env", "volumes", "volumeMounts", "imagePullSecrets"].includes(field)) return "name";
  if (field === "ports") return parentPath.endsWith("spec") ? "port" : "containerPort";
  return null;
};

// Strategic merge of `patch` into `base` (both plain JSON); returns a new value.
function smp(base, patch, at = "") {
  if (patch === null) return undefined;
  if (Array.isArray(patch)) {
    const field = at.split(".").pop();
    const parent = at.split(".").slice(0, -1).join(".");
    const key = mergeKey(field, parent);
    if (!key || !Array.isArray(base) || !patch.every((p) => p && typeof p === "object")) return structuredClone(patch);
    const out = [];
    const used = new Set();
    for (const p of patch) {
      const i = base.findIndex((b) => b && b[key] === p[key]);
      if (i >= 0) {
        used.add(i);
        out.push(smp(base[i], p, `${at}[]`));
      } else {
        out.push(smp(undefined, p, `${at}[]`));
      }
    }
    base.forEach((b, i) => { if (!used.has(i)) out.push(structuredClone(b)); });
    return out;
  }
  if (patch && typeof patch === "object") {
    const out = base && typeof base === "object" && !Array.isArray(base) ? structuredClone(base) : {};
    for (const [k, v] of Object.entries(patch)) {
      if (k === "$patch") throw new Error(`unsupported patch directive $patch at ${at}`);
      const merged = smp(out[k], v, at ? `${at}.${k}` : k);
      if (merged === undefined) delete out[k];
      else out[k] = merged;
    }
    return out;
  }
  return patch;
}

function podSpecs(o) {
  const t = o.spec?.jobTemplate?.spec?.template ?? o.spec?.template;
  return t?.spec ? [t.spec] : [];
}

function render(dir) {
  const kfile = kustomizationFile(dir);
  const k = YAML.parse(fs.readFileSync(kfile, "utf8"), { merge: true }) ?? {};
  for (const key of Object.keys(k)) {
    if (!SUPPORTED.has(key)) throw new Error(`${kfile}: "${key}" is not supported by kustomize-lite`);
  }
  let objects = [];
  for (const r of k.resources ?? []) {
    const p = path.resolve(dir, r);
    if (fs.statSync(p).isDirectory()) objects.push(...render(p));
    else objects.push(...readYamlStream(p));
  }
  for (const p of k.patches ?? []) {
    if (p.target || p.options) throw new Error(`${kfile}: patch targets/options are not supported`);
    const docs = p.path ? readYamlStream(path.resolve(dir, p.path)) : [YAML.parse(p.patch)];
    for (const doc of docs) {
      const i = objects.findIndex((o) => o.kind === doc.kind && o.metadata?.name === doc.metadata?.name);
      if (i < 0) throw new Error(`${kfile}: patch target ${doc.kind}/${doc.metadata?.name} not found`);
      objects[i] = smp(objects[i], doc);
    }
  }
  if (k.namePrefix) {
    const names = new Map();
    for (const o of objects) {
      names.set(`${o.kind}/${o.metadata.name}`, k.namePrefix + o.metadata.name);
      o.metadata.name = k.namePrefix + o.metadata.name;
    }
    const ref = (kind, n) => names.get(`${kind}/${n}`) ?? n;
    for (const o of objects) {
      if (o.kind === "StatefulSet" && o.spec?.serviceName) o.spec.serviceName = ref("Service", o.spec.serviceName);
      for (const ps of podSpecs(o)) {
        for (const c of [...(ps.initContainers ?? []), ...(ps.containers ?? [])]) {
          for (const e of c.envFrom ?? []) if (e.configMapRef) e.configMapRef.name = ref("ConfigMap", e.configMapRef.name);
          for (const e of c.env ?? []) {
            const r = e.valueFrom?.configMapKeyRef;
            if (r) r.name = ref("ConfigMap", r.name);
          }
        }
        for (const v of ps.volumes ?? []) if (v.configMap) v.configMap.name = ref("ConfigMap", v.configMap.name);
      }
    }
  }
  for (const l of k.labels ?? []) {
    if (l.includeSelectors || l.includeTemplates) throw new Error(`${kfile}: labels with includeSelectors/includeTemplates are not supported`);
    for (const o of objects) {
      o.metadata = o.metadata ?? {};
      o.metadata.labels = { ...(o.metadata.labels ?? {}), ...l.pairs };
    }
  }
  for (const img of k.images ?? []) {
    for (const o of objects) {
      for (const ps of podSpecs(o)) {
        for (const c of [...(ps.initContainers ?? []), ...(ps.containers ?? [])]) {
          const m = /^([^@]*?)(?::([^:/@]+))?(@.*)?$/.exec(c.image ?? "");
          if (!m || m[1] !== img.name) continue;
          const name = img.newName ?? m[1];
          const tag = img.newTag ?? m[2];
          c.image = img.digest ? `${name}@${img.digest}` : tag ? `${name}:${tag}` : name;
        }
      }
    }
  }
  return objects;
}

// Canonical form for --compare: objects sorted by kind/name, map keys
// sorted; list order kept (it matters: env order decides $(VAR) expansion).
function canonical(v) {
  if (Array.isArray(v)) return v.map(canonical);
  if (v && typeof v === "object") {
    return Object.fromEntries(Object.keys(v).sort().map((k) => [k, canonical(v[k])]));
  }
  return v;
}

const args = process.argv.slice(2);
try {
  if (args[0] === "--compare" && args.length === 3) {
    const load = (f) => readYamlStream(f).map(canonical)
      .sort((a, b) => `${a.kind}/${a.metadata?.name}`.localeCompare(`${b.kind}/${b.metadata?.name}`));
    const a = load(args[1]);
    const b = load(args[2]);
    const ja = a.map((o) => JSON.stringify(o));
    const jb = b.map((o) => JSON.stringify(o));
    let same = ja.length === jb.length;
    for (let i = 0; i < Math.max(ja.length, jb.length); ++i) {
      if (ja[i] !== jb[i]) {
        same = false;
        console.log(`differs: ${a[i]?.kind}/${a[i]?.metadata?.name} vs ${b[i]?.kind}/${b[i]?.metadata?.name}`);
        console.log(`  < ${ja[i]}`);
        console.log(`  > ${jb[i]}`);
      }
    }
    process.exit(same ? 0 : 1);
  } else if (args.length === 1) {
    const objects = render(path.resolve(args[0]));
    process.stdout.write(objects.map((o) => YAML.stringify(o)).join("---\n"));
  } else {
    console.error("usage: node kustomize-lite.mjs DIR | --compare A.yaml B.yaml");
    process.exit(2);
  }
} catch (e) {
  console.error(`kustomize-lite: ${e.message}`);
  process.exit(1);
}
