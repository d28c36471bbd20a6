#!/usr/bin/python3
"""Independent check of constrained outputs: Debian's python3-jsonschema (Draft 2020-12).

Reads JSON lines from the file named on the command line, each one of
  {"kind": "json", "schema": S, "text": T, "finish": F}
      T must be one JSON value (strict: no NaN/Infinity) valid for S when F is "stop"
      (F "length": cut short by max_tokens, counted but not checked).
  {"kind": "call", "schema": S, "arguments": A}
      A (a tool call's arguments text) must be a JSON object valid for S.
Prints one line of counts; exits 1 (listing the failures) if any output is wrong.
"""
import json
import sys

import jsonschema


def strict_loads(text):
    def no_constant(name):
        raise ValueError("non-standard constant " + name)
    return json.loads(text, parse_constant=no_constant)


def main():
    checked = {"json": 0, "call": 0, "length": 0}
    failures = []
    with open(sys.argv[1], encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            case = json.loads(line)
            schema = case["schema"]
            validator = jsonschema.Draft202012Validator(schema)
            if case["kind"] == "call":
                checked["call"] += 1
                try:
                    value = strict_loads(case["arguments"])
                    if not isinstance(value, dict):
                        raise ValueError("arguments are not a JSON object")
                    validator.validate(value)
                except Exception as e:  # noqa: BLE001 - any failure is reported
                    failures.append(f"line {n}: call arguments {case['arguments']!r}: {e}")
                continue
            if case["finish"] != "stop":
                checked["length"] += 1
                continue
            checked["json"] += 1
            try:
                validator.validate(strict_loads(case["text"]))
            except Exception as e:  # noqa: BLE001
                failures.append(f"line {n}: {case['text']!r}: {str(e).splitlines()[0]}")
    print(f"validated {checked['json']} JSON outputs and {checked['call']} tool-call arguments; "
          f"{checked['length']} cut short by max_tokens; {len(failures)} failures")
    for f in failures[:20]:
        print("  " + f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
