#!/usr/bin/env python3
"""What each failed test of a ctest run said, in a few lines: the lines of its output that
name a failure, then its last lines.

    failure_digest.py LAST_TEST_LOG [LINES]

LAST_TEST_LOG is ctest's Testing/Temporary/LastTest.log (every test's output, whatever
--output-on-failure printed inline, which a long run's log may have lost far above its end).
`make test` and fuzz/unit_tests.sh print it last, so that the end of a failed run names
what failed and why. LINES (default 12) bounds each part.
"""
import re
import sys

# Lines that say why: gtest's failures, the sanitizers' reports, our scripts' FAIL lines,
# timeouts and errors, and the names in a digest printed by a test that runs ctest itself
# (fuzz/unit_tests.sh).
TELLING = re.compile(r"^=== |FAIL|Failure|ERROR|SUMMARY:|error:|Expected|Which is|Value of|"
                     r"Actual:|timed out|Timeout|Assertion|runtime error|exit [1-9]")


def failed_tests(text):
    """(name, result line, output lines) of every test whose result is not 'Test Passed.'"""
    found = []
    # LastTest.log: a header per test ("N/M Testing: NAME"), its output between "Output:"
    # and "<end of output>", then its result ("Test Passed.", "Test Failed.", ...).
    pattern = re.compile(r"^\d+/\d+ Testing: (?P<name>[^\n]+)\n.*?^Output:\n-+\n"
                         r"(?P<out>.*?)^<end of output>\nTest time = *(?P<time>[0-9.]+) sec\n"
                         r"-+\n"
                         r"(?P<result>Test [^\n]*)",
                         re.S | re.M)
    for m in pattern.finditer(text):
        if m.group("result").strip() != "Test Passed.":
            result = f"{m.group('result').strip()} (after {m.group('time')} s)"
            found.append((m.group("name"), result, m.group("out").splitlines()))
    return found


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: failure_digest.py LAST_TEST_LOG [LINES]")
    lines = int(sys.argv[2]) if len(sys.argv) == 3 else 12
    try:
        text = open(sys.argv[1], errors="replace").read()
    except OSError as e:
        sys.exit(f"failure_digest.py: {e}")
    for name, result, out in failed_tests(text):
        print(f"=== {name}: {result}")
        telling = [l for l in out if TELLING.search(l)]
        tail = out[-lines:]
        for l in telling[:lines]:
            if l not in tail:
                print(f"  | {l[:300]}")
        if telling[lines:]:
            print(f"  | ({len(telling) - lines} more such lines)")
        print("  ...")
        for l in tail:
            print(f"  | {l[:300]}")


if __name__ == "__main__":
    main()
