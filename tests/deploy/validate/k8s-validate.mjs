// Strict offline validation of rendered Kubernetes manifests (what
// `kubectl kustomize` prints), one set of objects per invocation:
//
//   node k8s-validate.mjs [--name NAME] FILE.yaml...   (all files = one set)
//
// Per object:
//   - the official OpenAPI schema (kubernetes-models: types, formats,
//     required fields, enums),
//   - no unknown fields, checked like `kubectl apply --validate=strict`
//     against @kubernetes/client-node's model of every type,
//   - names that the API server accepts (DNS-1123 / DNS-1035).
// Across objects (what only a running cluster would otherwise reveal):
//   - workload selectors match their pod template labels; every Service
//     selects some pod template; its targetPorts exist there,
//   - a StatefulSet's serviceName is a headless Service selecting its pods,
//   - probe ports are ports of their container,
//   - ConfigMaps (and keys) referenced by env/envFrom/volumes exist,
//   - $(VAR) references in env values resolve,
//   - every container requests cpu and memory,
// and halka's own rules: pods disable service links (HALKA_* variables are
// read as flags), the workers' StatefulSet starts pods in parallel behind a
// Service that publishes not-ready addresses, HALKA_WORLD_SIZE = workers'
// replicas, HALKA_SHARDS = parameter servers' replicas, HALKA_ADVERTISE is
// the pod's stable DNS name on the listen port, HALKA_RENDEZVOUS names a
// Service port, CUDA images go with nvidia.com/gpu limits, and under TLS:
// no HALKA_INSECURE, no kubelet gRPC probes (plaintext), HALKA_TLS_* and
// token files under a mount of the container, readable by the pod's user,
// and keys of the Secret when the Secret is in the set.
//
// The Prometheus operator's PodMonitor and ServiceMonitor
// (monitoring.coreos.com/v1) are checked against the operator's CRD schema
// (@kubernetes-models/prometheus-operator), their fields against the
// operator's documented API (the CRD schema does not forbid unknown
// fields), their selectors against the set's pods and Services, and their
// ports against those pods' and Services' port names. halka's metrics:
// the rendezvous and every worker serve /metrics (HALKA_METRICS_PORT) on a
// container port named "metrics", and prometheus.io/port annotations name
// that port's number.
//
// Prints every problem, one a line, and exits 1 if there is any.
import fs from "node:fs";
import path from "node:path";
import YAML from "yaml";
import * as k8s from "@kubernetes/client-node";

const args = process.argv.slice(2);
let setName = "";
const files = [];
for (let i = 0; i < args.length; ++i) {
  if (args[i] === "--name") setName = args[++i];
  else files.push(args[i]);
}
if (files.length === 0) {
  console.error("usage: node k8s-validate.mjs [--name NAME] FILE.yaml...");
  process.exit(2);
}
setName = setName || files.map((f) => path.basename(f)).join("+");

const problems = [];
const problem = (obj, where, msg) => {
  const id = obj ? `${obj.kind}/${obj.metadata?.name ?? "?"}` : "-";
  problems.push(`${id}${where ? ` ${where}` : ""}: ${msg}`);
};

// ------------------------------------------------------------ load
const objects = [];
for (const f of files) {
  const text = fs.readFileSync(f, "utf8");
  for (const doc of YAML.parseAllDocuments(text, { merge: true })) {
    if (doc.errors.length) {
      for (const e of doc.errors) problems.push(`${f}: YAML: ${e.message}`);
      continue;
    }
    const o = doc.toJS();
    if (o === null || o === undefined) continue;
    if (typeof o !== "object" || Array.isArray(o)) {
      problems.push(`${f}: a document is not an object`);
      continue;
    }
    objects.push(o);
  }
}
if (objects.length === 0) problems.push("no objects to validate");

// ------------------------------------------------------------ per object
// apiVersion "apps/v1" -> kubernetes-models module "apps/v1", client-node
// class prefix "V1"; core "v1" -> "v1", "V1".
function modelPaths(apiVersion, kind) {
  const parts = String(apiVersion).split("/");
  const version = parts.length === 2 ? parts[1] : parts[0];
  const group = parts.length === 2 ? parts[0] : "";
  const mod = group ? `kubernetes-models/${group}/${version}/${kind}`
                    : `kubernetes-models/${version}/${kind}`;
  const cls = version.charAt(0).toUpperCase() + version.slice(1) + kind;
  return { mod, cls };
}

// Walks `value` against client-node's attributeTypeMap of `type`,
// reporting fields the API does not have (strict field validation) and
// objects/arrays where the other is expected. Scalar types are left to the
// JSON schema (which knows int-or-string and quantities).
function strictWalk(obj, value, type, where) {
  if (value === null || value === undefined) return;
  type = type.trim();
  let m;
  if ((m = /^Array<(.+)>$/.exec(type))) {
    if (!Array.isArray(value)) {
      problem(obj, where, `expected a list, got ${typeof value}`);
      return;
    }
    value.forEach((v, i) => strictWalk(obj, v, m[1], `${where}[${i}]`));
    return;
  }
  if ((m = /^\{ \[key: string\]: (.+); \}$/.exec(type))) {
    if (typeof value !== "object" || Array.isArray(value)) {
      problem(obj, where, `expected a map, got ${Array.isArray(value) ? "a list" : typeof value}`);
      return;
    }
    for (const [k, v] of Object.entries(value)) strictWalk(obj, v, m[1], `${where}.${k}`);
    return;
  }
  if (["string", "number", "boolean", "Date", "any", "object", "IntOrString"].includes(type)) {
    if (type !== "any" && type !== "object" && typeof value === "object") {
      problem(obj, where, `expected a ${type === "IntOrString" ? "number or string" : type}, got ${Array.isArray(value) ? "a list" : "a map"}`);
    }
    return;
  }
  const cls = k8s[type];
  if (!cls || !cls.attributeTypeMap) return;  // unknown model: schema only
  if (typeof value !== "object" || Array.isArray(value)) {
    problem(obj, where, `expected an object (${type}), got ${Array.isArray(value) ? "a list" : typeof value}`);
    return;
  }
  const fields = new Map(cls.attributeTypeMap.map((a) => [a.baseName, a.type]));
  for (const [k, v] of Object.entries(value)) {
    if (!fields.has(k)) {
      problem(obj, `${where}.${k}`.replace(/^\./, ""), `unknown field "${k}" (not in ${type})`);
      continue;
    }
    strictWalk(obj, v, fields.get(k), `${where}.${k}`);
  }
}

const DNS1123_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const DNS1123_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const DNS1035_LABEL = /^[a-z]([-a-z0-9]*[a-z0-9])?$/;
const LABEL_VALUE = /^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$/;
const LABEL_NAME = /^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$/;

function checkLabels(obj, labels, where) {
  for (const [k, v] of Object.entries(labels ?? {})) {
    const name = k.includes("/") ? k.split("/")[1] : k;
    if (!LABEL_NAME.test(k) || name.length > 63) problem(obj, where, `invalid label key "${k}"`);
    if (typeof v !== "string" || !LABEL_VALUE.test(v) || v.length > 63) {
      problem(obj, where, `invalid label value ${JSON.stringify(v)} for "${k}"`);
    }
  }
}

// The documented fields of the Prometheus operator's monitors (v0.7x API
// reference: PodMonitorSpec, ServiceMonitorSpec, PodMetricsEndpoint,
// Endpoint), checked like strictWalk does for the built-in kinds.
const MONITOR_SPEC = ["jobLabel", "podTargetLabels", "targetLabels", "selector",
  "namespaceSelector", "sampleLimit", "targetLimit", "labelLimit",
  "labelNameLengthLimit", "labelValueLengthLimit", "keepDroppedTargets",
  "attachMetadata", "scrapeProtocols", "scrapeClass", "bodySizeLimit"];
const MONITOR_ENDPOINT = ["port", "targetPort", "path", "scheme", "params",
  "interval", "scrapeTimeout", "tlsConfig", "bearerTokenSecret", "honorLabels",
  "honorTimestamps", "trackTimestampsStaleness", "basicAuth", "oauth2",
  "authorization", "metricRelabelings", "relabelings", "proxyUrl",
  "followRedirects", "enableHttp2", "filterRunning"];
const MONITORS = {
  PodMonitor: { list: "podMetricsEndpoints", endpoint: "PodMetricsEndpoint",
                extra: ["portNumber"] },
  ServiceMonitor: { list: "endpoints", endpoint: "Endpoint",
                    extra: ["bearerTokenFile"] },
};
function checkMonitorFields(o) {
  const m = MONITORS[o.kind];
  const known = (obj, allowed, where, type) => {
    if (typeof obj !== "object" || obj === null || Array.isArray(obj)) return;
    for (const k of Object.keys(obj)) {
      if (!allowed.includes(k)) problem(o, `${where}.${k}`, `unknown field "${k}" (not in ${type})`);
    }
  };
  known(o, ["apiVersion", "kind", "metadata", "spec"], "", o.kind);
  strictWalk(o, o.metadata, "V1ObjectMeta", "metadata");
  known(o.spec, [...MONITOR_SPEC, m.list], "spec", `${o.kind}Spec`);
  strictWalk(o, o.spec?.selector, "V1LabelSelector", "spec.selector");
  (o.spec?.[m.list] ?? []).forEach((e, i) =>
    known(e, [...MONITOR_ENDPOINT, ...m.extra], `spec.${m.list}[${i}]`, m.endpoint));
}

for (const o of objects) {
  if (!o.apiVersion || !o.kind) {
    problem(o, "", "missing apiVersion or kind");
    continue;
  }
  if (o.apiVersion === "monitoring.coreos.com/v1" && MONITORS[o.kind]) {
    const Model = (await import(`@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/${o.kind}`))[o.kind];
    try {
      new Model(o).validate();
    } catch (e) {
      for (const line of String(e.message).split(/, (?=data)/)) {
        problem(o, "", `schema: ${line.replace(/^data\/?/, "/")}`);
      }
    }
    checkMonitorFields(o);
    if (!DNS1123_SUBDOMAIN.test(o.metadata?.name ?? "")) problem(o, "metadata.name", "not a valid DNS-1123 subdomain");
    checkLabels(o, o.metadata?.labels, "metadata.labels");
    continue;
  }
  const { mod, cls } = modelPaths(o.apiVersion, o.kind);
  let Model;
  try {
    Model = (await import(mod))[o.kind];
  } catch {
    Model = undefined;
  }
  if (!Model || !k8s[cls]) {
    problem(o, "", `unknown apiVersion/kind ${o.apiVersion} ${o.kind}`);
    continue;
  }
  try {
    new Model(o).validate();
  } catch (e) {
    for (const line of String(e.message).split(/, (?=data)/)) {
      problem(o, "", `schema: ${line.replace(/^data\/?/, "/")}`);
    }
  }
  strictWalk(o, o, cls, "");
  const name = o.metadata?.name ?? "";
  const dns = o.kind === "Service" ? DNS1035_LABEL : DNS1123_SUBDOMAIN;
  if (!name || !dns.test(name) || name.length > (o.kind === "Service" ? 63 : 253)) {
    problem(o, "metadata.name", `"${name}" is not a valid ${o.kind === "Service" ? "DNS-1035 label" : "DNS-1123 subdomain"}`);
  }
  if (o.kind === "StatefulSet" && name.length > 52) {
    problem(o, "metadata.name", "longer than 52 characters (the controller-revision-hash label would not fit)");
  }
  checkLabels(o, o.metadata?.labels, "metadata.labels");
}

// ------------------------------------------------------------ cross-object
const key = (o) => `${o.kind}/${o.metadata?.name}`;
const seen = new Set();
for (const o of objects) {
  if (seen.has(key(o))) problem(o, "", "defined twice");
  seen.add(key(o));
}
const byKind = (kind) => objects.filter((o) => o.kind === kind);
const find = (kind, name) => objects.find((o) => o.kind === kind && o.metadata?.name === name);
const configMaps = byKind("ConfigMap");

const WORKLOADS = ["Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"];
const workloads = objects.filter((o) => WORKLOADS.includes(o.kind) && o.spec?.template);
const podLabels = (w) => w.spec?.template?.metadata?.labels ?? {};
const containersOf = (w) => [...(w.spec?.template?.spec?.initContainers ?? []),
                             ...(w.spec?.template?.spec?.containers ?? [])];
const subset = (sel, labels) => Object.entries(sel ?? {}).every(([k, v]) => labels[k] === v);
const selects = (svc, w) => {
  const sel = svc.spec?.selector;
  return sel && Object.keys(sel).length > 0 && subset(sel, podLabels(w));
};
const portNum = (hostport) => {
  const m = /:(\d+)$/.exec(String(hostport ?? ""));
  return m ? Number(m[1]) : undefined;
};
const imageTag = (image) => {
  const last = String(image ?? "").split("/").pop();
  return last.includes("@") ? "" : (last.split(":")[1] ?? "latest");
};

// The environment a container sees (envFrom ConfigMaps, then env), for
// halka's rules. Values from fieldRef etc. are left as "<fieldRef>".
function containerEnv(c) {
  const env = new Map();
  for (const src of c.envFrom ?? []) {
    const cm = src.configMapRef && find("ConfigMap", src.configMapRef.name);
    for (const [k, v] of Object.entries(cm?.data ?? {})) env.set((src.prefix ?? "") + k, v);
  }
  for (const e of c.env ?? []) {
    if (e.value !== undefined) env.set(e.name, String(e.value));
    else if (e.valueFrom?.configMapKeyRef) {
      const cm = find("ConfigMap", e.valueFrom.configMapKeyRef.name);
      env.set(e.name, cm?.data?.[e.valueFrom.configMapKeyRef.key]);
    } else env.set(e.name, `<${Object.keys(e.valueFrom ?? {})[0] ?? "?"}>`);
  }
  return env;
}
// The program a container runs: command (overrides the entrypoint) or the
// first arg (the image's halka-entrypoint runs its arguments).
function program(c) {
  const argv = [...(c.command ?? []), ...(c.args ?? [])];
  if (c.command && !/entrypoint/.test(c.command[0])) return path.basename(String(c.command[0]));
  return path.basename(String((c.command ? argv[1] : argv[0]) ?? ""));
}

for (const w of workloads) {
  const sel = w.spec?.selector?.matchLabels;
  if (w.kind !== "Job" || sel) {
    if (!sel || Object.keys(sel).length === 0) {
      if (w.kind !== "Job") problem(w, "spec.selector", "has no matchLabels");
    } else if (!subset(sel, podLabels(w))) {
      problem(w, "spec.selector", `matchLabels ${JSON.stringify(sel)} do not match the pod template's labels ${JSON.stringify(podLabels(w))}`);
    }
  }
  checkLabels(w, podLabels(w), "spec.template.metadata.labels");
  const pod = w.spec.template.spec ?? {};
  if (pod.enableServiceLinks !== false) {
    problem(w, "spec.template.spec.enableServiceLinks", "must be false: service links inject HALKA_*_PORT... variables and halka reads every HALKA_<FLAG> variable as a flag");
  }
  for (const c of containersOf(w)) {
    const where = `container "${c.name}"`;
    const ports = c.ports ?? [];
    const hasPort = (p) => typeof p === "number" ? ports.some((q) => q.containerPort === p)
                                                 : ports.some((q) => q.name === p);
    for (const probeName of ["livenessProbe", "readinessProbe", "startupProbe"]) {
      const pr = c[probeName];
      if (!pr) continue;
      for (const action of ["grpc", "httpGet", "tcpSocket"]) {
        if (pr[action] && pr[action].port !== undefined && !hasPort(pr[action].port)) {
          problem(w, `${where} ${probeName}.${action}.port`, `${pr[action].port} is not a port of the container (${ports.map((p) => `${p.name ?? ""}:${p.containerPort}`).join(", ") || "none"})`);
        }
      }
    }
    const req = c.resources?.requests ?? {};
    for (const r of ["cpu", "memory"]) {
      if (req[r] === undefined) problem(w, `${where} resources.requests`, `no ${r} request`);
    }
    // ConfigMap references
    for (const src of c.envFrom ?? []) {
      const ref = src.configMapRef;
      if (ref && !ref.optional && !find("ConfigMap", ref.name)) {
        problem(w, `${where} envFrom`, `ConfigMap "${ref.name}" is not defined`);
      }
    }
    const defined = new Set();
    for (const src of c.envFrom ?? []) {
      const cm = src.configMapRef && find("ConfigMap", src.configMapRef.name);
      for (const k of Object.keys(cm?.data ?? {})) defined.add((src.prefix ?? "") + k);
    }
    for (const e of c.env ?? []) {
      const ref = e.valueFrom?.configMapKeyRef;
      if (ref && !ref.optional) {
        const cm = find("ConfigMap", ref.name);
        if (!cm) problem(w, `${where} env ${e.name}`, `ConfigMap "${ref.name}" is not defined`);
        else if (!(ref.key in (cm.data ?? {}))) problem(w, `${where} env ${e.name}`, `ConfigMap "${ref.name}" has no key "${ref.key}"`);
      }
      if (typeof e.value === "string") {
        for (const m of e.value.matchAll(/(\$+)\(([A-Za-z_][A-Za-z0-9_]*)\)/g)) {
          if (m[1].length % 2 === 0) continue;  // $$(X) is an escaped literal
          if (!defined.has(m[2])) {
            problem(w, `${where} env ${e.name}`, `$(${m[2]}) refers to no variable defined before it (Kubernetes would pass it on literally)`);
          }
        }
      }
      defined.add(e.name);
    }
    // GPU and image pairing
    const gpu = c.resources?.limits?.["nvidia.com/gpu"];
    const cuda = /cuda/.test(imageTag(c.image));
    if (cuda && !(Number(gpu) >= 1)) {
      problem(w, `${where} resources.limits`, `runs the CUDA image ${c.image} without an nvidia.com/gpu limit`);
    }
    if (Number(gpu) >= 1 && !cuda) {
      problem(w, `${where} image`, `has an nvidia.com/gpu limit but runs the non-CUDA image ${c.image}`);
    }
  }
  for (const v of pod.volumes ?? []) {
    if (v.configMap && !v.configMap.optional && !find("ConfigMap", v.configMap.name)) {
      problem(w, `volume "${v.name}"`, `ConfigMap "${v.configMap.name}" is not defined`);
    }
  }
}

for (const svc of byKind("Service")) {
  const sel = svc.spec?.selector;
  if (!sel || Object.keys(sel).length === 0) continue;  // manual endpoints
  const targets = workloads.filter((w) => selects(svc, w));
  if (targets.length === 0) {
    problem(svc, "spec.selector", `${JSON.stringify(sel)} selects no pod template in this set`);
    continue;
  }
  for (const p of svc.spec?.ports ?? []) {
    const tp = p.targetPort ?? p.port;
    for (const w of targets) {
      const ok = containersOf(w).some((c) => (c.ports ?? []).some((q) =>
        typeof tp === "number" ? q.containerPort === tp : q.name === tp));
      if (!ok) problem(svc, `spec.ports "${p.name ?? p.port}"`, `targetPort ${tp} is not a container port of ${key(w)}`);
    }
  }
}

for (const sts of byKind("StatefulSet")) {
  const name = sts.spec?.serviceName;
  const svc = name && find("Service", name);
  if (!name) {
    problem(sts, "spec.serviceName", "is not set (pods get no stable DNS names)");
  } else if (!svc) {
    problem(sts, "spec.serviceName", `Service "${name}" is not defined`);
  } else {
    if (svc.spec?.clusterIP !== "None") {
      problem(sts, "spec.serviceName", `Service "${name}" is not headless (clusterIP: None)`);
    }
    if (!selects(svc, sts)) problem(sts, "spec.serviceName", `Service "${name}" does not select this StatefulSet's pods`);
  }
}

// ------------------------------------------------------------ halka's rules
for (const w of workloads) {
  for (const c of containersOf(w)) {
    const prog = program(c);
    const env = containerEnv(c);
    const where = `container "${c.name}"`;
    const rdv = env.get("HALKA_RENDEZVOUS");
    if (rdv !== undefined && !/^</.test(rdv)) {
      const host = rdv.replace(/:\d+$/, "").split(".")[0];
      const svc = find("Service", host);
      if (!svc) {
        problem(w, `${where} HALKA_RENDEZVOUS`, `"${rdv}": no Service "${host}" in this set`);
      } else if (!(svc.spec?.ports ?? []).some((p) => p.port === portNum(rdv))) {
        problem(w, `${where} HALKA_RENDEZVOUS`, `"${rdv}": Service "${host}" has no port ${portNum(rdv)}`);
      }
    }
    // TLS: consistent flags, files that are mounted (and, when the Secret
    // is in the set, present in it and readable by the pod's user), and
    // probes that can speak TLS.
    const pod = w.spec.template.spec ?? {};
    const tls = env.get("HALKA_TLS_CERT") !== undefined || env.get("HALKA_TLS_CA") !== undefined;
    if (tls && /^(1|true|yes)$/i.test(env.get("HALKA_INSECURE") ?? "")) {
      problem(w, `${where} HALKA_INSECURE`, "is true while HALKA_TLS_* are set: plaintext or TLS, not both");
    }
    if ((env.get("HALKA_TLS_CERT") === undefined) !== (env.get("HALKA_TLS_KEY") === undefined)) {
      problem(w, where, "HALKA_TLS_CERT and HALKA_TLS_KEY come together");
    }
    if (tls) {
      for (const probeName of ["livenessProbe", "readinessProbe", "startupProbe"]) {
        if (c[probeName]?.grpc) {
          problem(w, `${where} ${probeName}.grpc`, "the kubelet's gRPC probe speaks plaintext and fails against a TLS port: probe with exec [halka-healthcheck]");
        }
      }
    }
    for (const v of ["HALKA_TLS_CERT", "HALKA_TLS_KEY", "HALKA_TLS_CA", "HALKA_JOB_TOKEN_FILE", "HALKA_JOB_TOKENS_FILE"]) {
      const file = env.get(v);
      if (!file || !file.startsWith("/")) continue;
      const m = (c.volumeMounts ?? []).find((x) => file.startsWith(x.mountPath.replace(/\/?$/, "/")));
      if (!m) {
        problem(w, `${where} ${v}`, `"${file}" lies under no volumeMount of the container`);
        continue;
      }
      const vol = (pod.volumes ?? []).find((x) => x.name === m.name);
      if (!vol?.secret) continue;
      const mode = vol.secret.defaultMode ?? 0o644;
      const user = c.securityContext?.runAsUser ?? pod.securityContext?.runAsUser;
      if (user !== 0 && !(mode & 0o004) && !((mode & 0o040) && pod.securityContext?.fsGroup !== undefined)) {
        problem(w, `volume "${vol.name}"`, `Secret files of mode 0${mode.toString(8)} are root's: unreadable by uid ${user ?? "(image default)"} without a pod fsGroup`);
      }
      const secret = find("Secret", vol.secret.secretName);
      const k = file.slice(m.mountPath.replace(/\/?$/, "/").length);
      if (secret && !(k in (secret.data ?? {})) && !(k in (secret.stringData ?? {}))) {
        problem(w, `${where} ${v}`, `Secret "${vol.secret.secretName}" has no key "${k}"`);
      }
    }
    if (prog !== "halka-worker" && prog !== "halka-ps") continue;
    const listenPort = portNum(env.get("HALKA_LISTEN"));
    if (listenPort === undefined) {
      problem(w, `${where} HALKA_LISTEN`, "is not set to HOST:PORT (the daemon would listen on 127.0.0.1 only)");
    } else if (!(c.ports ?? []).some((p) => p.containerPort === listenPort)) {
      problem(w, `${where} HALKA_LISTEN`, `port ${listenPort} is not a container port`);
    }
    if (w.kind !== "StatefulSet") {
      problem(w, where, `${prog} must run in a StatefulSet (stable names and ordinals)`);
      continue;
    }
    const adv = env.get("HALKA_ADVERTISE") ?? "";
    const svcName = w.spec?.serviceName;
    if (!adv.startsWith("$(POD_NAME).") && !adv.startsWith("$(HALKA_POD_NAME).")) {
      problem(w, `${where} HALKA_ADVERTISE`, `"${adv}" is not the pod's stable DNS name ($(POD_NAME).<service>...)`);
    } else if (adv.split(".")[1] !== svcName) {
      problem(w, `${where} HALKA_ADVERTISE`, `"${adv}" does not go through the StatefulSet's Service "${svcName}"`);
    }
    if (portNum(adv) !== listenPort) {
      problem(w, `${where} HALKA_ADVERTISE`, `port ${portNum(adv)} differs from the listen port ${listenPort}`);
    }
    const ordinal = env.get("HALKA_ORDINAL_FROM_HOSTNAME") === "1";
    const replicas = w.spec?.replicas ?? 1;
    if (prog === "halka-worker") {
      if (!ordinal && env.get("HALKA_RANK") === undefined) {
        problem(w, where, "neither HALKA_ORDINAL_FROM_HOSTNAME=1 nor HALKA_RANK: ranks would follow join order, not ordinals");
      }
      if (w.spec?.podManagementPolicy !== "Parallel") {
        problem(w, "spec.podManagementPolicy", "must be Parallel: with OrderedReady pod 0 waits for a Ready that comes only when every rank joined");
      }
      const ws = Number(env.get("HALKA_WORLD_SIZE"));
      if (ws !== replicas) {
        problem(w, "spec.replicas", `${replicas} replicas but HALKA_WORLD_SIZE=${env.get("HALKA_WORLD_SIZE")}`);
      }
      const svc = svcName && find("Service", svcName);
      if (svc && svc.spec?.publishNotReadyAddresses !== true) {
        problem(svc, "spec.publishNotReadyAddresses", `must be true: the workers of ${key(w)} turn Ready only after they found each other by DNS`);
      }
    } else {
      if (!ordinal && env.get("HALKA_SHARD") === undefined && replicas > 1) {
        problem(w, where, "several shards but neither HALKA_ORDINAL_FROM_HOSTNAME=1 nor HALKA_SHARD");
      }
      const shards = Number(env.get("HALKA_SHARDS") ?? 1);
      if (shards !== replicas) {
        problem(w, "spec.replicas", `${replicas} replicas but HALKA_SHARDS=${env.get("HALKA_SHARDS") ?? 1}`);
      }
    }
  }
}

// ------------------------------------------------------------ metrics
// A LabelSelector (matchLabels and matchExpressions) against labels.
const matches = (sel, labels) => subset(sel?.matchLabels, labels) &&
  (sel?.matchExpressions ?? []).every((x) => {
    const has = Object.prototype.hasOwnProperty.call(labels, x.key);
    switch (x.operator) {
      case "In": return has && (x.values ?? []).includes(labels[x.key]);
      case "NotIn": return !has || !(x.values ?? []).includes(labels[x.key]);
      case "Exists": return has;
      case "DoesNotExist": return !has;
      default: return false;
    }
  });
for (const w of workloads) {
  const ann = w.spec.template.metadata?.annotations ?? {};
  const served = [];  // metrics ports of the pod's halka daemons
  for (const c of containersOf(w)) {
    const prog = program(c);
    if (!["halka-worker", "halka-rendezvous"].includes(prog)) continue;
    const where = `container "${c.name}"`;
    const port = Number(containerEnv(c).get("HALKA_METRICS_PORT") ?? 0);
    if (!port) {
      problem(w, where, `${prog} serves no /metrics (HALKA_METRICS_PORT unset or 0): nothing can scrape it`);
      continue;
    }
    served.push(port);
    const named = (c.ports ?? []).find((p) => p.name === "metrics");
    if (!named || named.containerPort !== port) {
      problem(w, `${where} ports`, `no port named "metrics" with containerPort ${port} (HALKA_METRICS_PORT)`);
    }
  }
  if (ann["prometheus.io/scrape"] === "true" &&
      !served.includes(Number(ann["prometheus.io/port"]))) {
    problem(w, "spec.template.metadata.annotations", `prometheus.io/port "${ann["prometheus.io/port"]}" is not a metrics port of the pod (${served.join(", ") || "none"})`);
  }
}
for (const mon of objects.filter((o) => MONITORS[o.kind] && o.apiVersion === "monitoring.coreos.com/v1")) {
  const sel = mon.spec?.selector ?? {};
  const { list } = MONITORS[mon.kind];
  // What the monitor scrapes, and the port names each one has.
  const targets = mon.kind === "PodMonitor"
    ? workloads.filter((w) => matches(sel, podLabels(w))).map((w) =>
        [key(w), containersOf(w).flatMap((c) => (c.ports ?? []).map((p) => p.name))])
    : byKind("Service").filter((s) => matches(sel, s.metadata?.labels ?? {})).map((s) =>
        [key(s), (s.spec?.ports ?? []).map((p) => p.name)]);
  if (targets.length === 0) {
    problem(mon, "spec.selector", `selects no ${mon.kind === "PodMonitor" ? "pod template" : "Service"} of the set`);
  }
  (mon.spec?.[list] ?? []).forEach((e, i) => {
    if (e.port === undefined) return;
    for (const [t, names] of targets) {
      if (!names.includes(e.port)) {
        problem(mon, `spec.${list}[${i}].port`, `"${e.port}" is not a named port of ${t} (${names.filter(Boolean).join(", ") || "none"})`);
      }
    }
  });
}

// ------------------------------------------------------------ report
const kinds = {};
for (const o of objects) kinds[o.kind] = (kinds[o.kind] ?? 0) + 1;
const summary = Object.entries(kinds).map(([k, n]) => `${n} ${k}`).join(", ");
if (problems.length) {
  for (const p of problems) console.log(`${setName}: ${p}`);
  console.log(`${setName}: REJECTED (${problems.length} problem${problems.length > 1 ? "s" : ""}; ${summary})`);
  process.exit(1);
}
console.log(`${setName}: valid (${summary})`);
