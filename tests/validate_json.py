#!/usr/bin/python3
"""Independent check of constrained outputs: Debian's python3-jsonschema (Draft 2020-12).

Formats are checked too: the library's own checkers (date, email, ipv4, ipv6, uuid; uri and
uri-reference through python3-rfc3987), and where Debian lacks the package the library would
use, checks written here from the RFCs with Python's standard library (date-time and time
through datetime, hostname per RFC 1123, duration per ISO 8601 / RFC 3339 appendix A).
Patterns are Python's `re` (search), an engine independent of the one under test.

Reads JSON lines from the file named on the command line, each one of
  {"kind": "json", "schema": S, "text": T, "finish": F}
      T must be one JSON value (strict: no NaN/Infinity) valid for S when F is "stop"
      (F "length": cut short by max_tokens, counted but not checked).
  {"kind": "call", "schema": S, "arguments": A}
      A (a tool call's arguments text) must be a JSON object valid for S.
Prints one line of counts; exits 1 (listing the failures) if any output is wrong.
"""
import datetime
import json
import re
import sys

import jsonschema

FORMATS = jsonschema.FormatChecker()


def _rfc3339_datetime(text):
    m = re.fullmatch(r"(\d{4}-\d\d-\d\d)[Tt](\d\d:\d\d:\d\d)(\.\d+)?([Zz]|[+-]\d\d:\d\d)", text)
    if not m or not text.isascii():
        return False
    date, clock, fraction, offset = m.groups()
    offset = "+00:00" if offset in ("Z", "z") else offset
    datetime.datetime.fromisoformat(f"{date}T{clock}{(fraction or '')[:7]}{offset}")  # raises when invalid
    return True


@FORMATS.checks("date-time", raises=ValueError)
def _date_time(instance):
    return not isinstance(instance, str) or _rfc3339_datetime(instance)


@FORMATS.checks("time", raises=ValueError)
def _time(instance):
    return not isinstance(instance, str) or _rfc3339_datetime("2000-01-01T" + instance)


@FORMATS.checks("hostname")
def _hostname(instance):
    if not isinstance(instance, str):
        return True
    labels = instance.split(".")
    return 0 < len(instance) <= 253 and all(
        0 < len(label) <= 63 and label[0] != "-" and label[-1] != "-" and label.isascii()
        and all(c.isalnum() or c == "-" for c in label) for label in labels)


@FORMATS.checks("duration")
def _duration(instance):
    if not isinstance(instance, str) or instance == "P":
        return isinstance(instance, str) is False
    if not instance.startswith("P"):
        return False
    body = instance[1:]
    if re.fullmatch(r"\d+W", body):
        return True
    date_part, _, time_part = body.partition("T")
    if "T" in body and not time_part:
        return False
    order = {"": "YMD", "T": "HMS"}
    for part, units in ((date_part, order[""]), (time_part, order["T"])):
        found = re.findall(r"(\d+)([A-Z])", part)
        if "".join(n + u for n, u in found) != part:
            return False
        letters = [u for _, u in found]
        if any(u not in units for u in letters) or letters != sorted(letters, key=units.index) or len(set(letters)) != len(letters):
            return False
    return bool(date_part or time_part)


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
            # The draft the schema's $schema names (2020-12 when it names none).
            cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
            validator = cls(schema, format_checker=FORMATS)
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
