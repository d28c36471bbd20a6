#!/usr/bin/python3
"""Builds tests/schema_corpus/ from two public collections (run by hand; its output is checked in):

  - the JSON Schema Test Suite (json-schema-org/JSON-Schema-Test-Suite, MIT): every group of the
    draft2020-12 and draft7 keyword tests, a schema with instances marked valid or invalid;
  - SchemaStore (SchemaStore/schemastore, Apache-2.0): real-world schemas with the JSON files of
    their src/test (valid) and src/negative_test (invalid) folders.

Usage: scripts/make_schema_corpus.py SUITE_DIR SUITE_COMMIT SCHEMASTORE_DIR SCHEMASTORE_COMMIT OUT_DIR
(the directories hold the files of those commits, e.g. from `git archive`).
Each collection is one JSON-lines file; a line is an entry {"name", "schema", "valid": [...],
"invalid": [...]} whose instances keep the key order the source wrote them in.
"""
import json
import os
import sys

# Remote references, the metaschema and the vocabulary machinery are outside a request's reach.
SKIP_SUITE = {"refRemote.json", "vocabulary.json", "defs.json", "infinite-loop-detection.json"}
SCHEMASTORE = [
    "all-contributors", "appsettings", "asconfig-schema", "attw", "ava", "azure-deviceupdate-import-manifest-4.0",
    "chart", "chrome-manifest", "claude-code-keybindings", "claude-code-settings", "cloudbuild", "codecov",
    "dependabot-2.0", "github-action", "github-funding", "github-issue-config", "github-issue-forms", "global",
    "importmap", "jasmine", "liquibase", "madge", "mail-servers-config", "ninjs-2.0", "okf-0.1", "package", "pdm",
    "pre-commit-config", "prisma", "s3-bucket-cors", "staticwebapp.config", "stylelintrc", "unist",
    "web-manifest-share-target", "web-types", "youtrack-app",
]
MAX_SCHEMA_BYTES = 300_000


def compact(value):
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def write_entry(f, name, schema, valid, invalid):
    f.write(json.dumps({"name": name, "schema": schema, "valid": valid, "invalid": invalid}, separators=(",", ":"),
                       ensure_ascii=False) + "\n")


def main():
    suite, suite_commit, store, store_commit, out = sys.argv[1:6]
    os.makedirs(out, exist_ok=True)
    entries = 0
    for draft in ("draft2020-12", "draft7"):
        folder = os.path.join(suite, "tests", draft)
        f = open(os.path.join(out, f"suite-{draft}.jsonl"), "w", encoding="utf-8")
        for file in sorted(os.listdir(folder)):
            if not file.endswith(".json") or file in SKIP_SUITE:
                continue
            with open(os.path.join(folder, file), encoding="utf-8") as g:
                groups = json.load(g)
            for i, group in enumerate(groups):
                schema = group["schema"]
                if isinstance(schema, dict) and "$schema" not in schema and draft == "draft7":
                    schema = {"$schema": "http://json-schema.org/draft-07/schema#", **schema}
                valid = [t["data"] for t in group["tests"] if t["valid"]]
                invalid = [t["data"] for t in group["tests"] if not t["valid"]]
                write_entry(f, f"{draft}/{file[:-5]}/{i}", schema, valid, invalid)
                entries += 1
        f.close()
    f = open(os.path.join(out, "schemastore.jsonl"), "w", encoding="utf-8")
    for name in SCHEMASTORE:
        path = os.path.join(store, "src", "schemas", "json", name + ".json")
        if os.path.getsize(path) > MAX_SCHEMA_BYTES:
            continue
        with open(path, encoding="utf-8-sig") as g:
            schema = json.load(g)
        instances = {}
        for kind, sub in (("valid", "test"), ("invalid", "negative_test")):
            folder = os.path.join(store, "src", sub, name)
            items = []
            for file in sorted(os.listdir(folder)):
                if file.endswith(".json"):
                    with open(os.path.join(folder, file), encoding="utf-8-sig") as g:
                        items.append(json.load(g))
            instances[kind] = items
        write_entry(f, "schemastore/" + name, schema, instances["valid"], instances["invalid"])
        entries += 1
    f.close()
    with open(os.path.join(out, "SOURCES.md"), "w", encoding="utf-8") as f:
        f.write("# Where these schemas come from\n\n"
                f"Made by `scripts/make_schema_corpus.py`; {entries} entries.\n\n"
                f"- `suite-*.jsonl`: the JSON Schema Test Suite, https://github.com/json-schema-org/JSON-Schema-Test-Suite "
                f"at {suite_commit} (MIT license), tests/draft2020-12 and tests/draft7 less "
                f"{', '.join(sorted(SKIP_SUITE))}.\n"
                f"- `schemastore.jsonl`: SchemaStore, https://github.com/SchemaStore/schemastore at {store_commit} "
                f"(Apache-2.0 license): src/schemas/json/NAME.json with the JSON files of src/test/NAME (valid) and "
                f"src/negative_test/NAME (invalid).\n")
    print(f"{entries} entries in {out}")


if __name__ == "__main__":
    main()
