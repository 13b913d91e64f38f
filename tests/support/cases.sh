# cases.sh -- the case runner that the shell tests source: `run NAME FUNCTION` runs one case
# with its output in $d/NAME.log and prints "ok NAME (time)" or "FAIL NAME (time): reason"
# with the log's last 60 lines; a case gives its reason with `why TEXT` (which returns 1).
# $d is the test's own temp folder; CASES_VERBOSE=1 prints every case's log. The counts are
# in $passed and $failed.
passed=0
failed=0
run() {
	local t0=$SECONDS
	: >"$d/why"
	if "$2" >"$d/$1.log" 2>&1; then
		passed=$((passed + 1))
		echo "ok   $1 ($((SECONDS - t0)) s)"
		[ "${CASES_VERBOSE:-0}" = 0 ] || sed 's/^/    /' "$d/$1.log"
	else
		failed=$((failed + 1))
		echo "FAIL $1 ($((SECONDS - t0)) s): $(cat "$d/why")"
		sed 's/^/    /' "$d/$1.log" | tail -60
	fi
}
why() {
	echo "$*" >"$d/why"
	return 1
}
