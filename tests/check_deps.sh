#!/usr/bin/env bash
# make check-deps: every #include "dir/file.h" in a module's sources must name
# the module's own files or the public header of a module it may depend on
# (the DEPS_<module> lists of the Makefile, exported to this script). An
# internal header (*_i.h) is never included from another folder. Also fails
# when the declared graph itself has a cycle. Exit status 1 names each
# offending line.
set -u
cd "$(dirname "$0")/.."
modules="ptc common net transform dataset store cluster mount tools"
# Single files allowed one edge more than their module: the daemon's
# start-up starts the control plane (DESIGN section 11).
extra_mount_mlfs_daemon_c="cluster"
bad=0
deps_of() { local v="DEPS_$1"; echo "${!v-}"; }
for m in $modules; do
	v="DEPS_$m"
	if [ -z "${!v+x}" ]; then echo "check-deps: DEPS_$m is not set (run it as make check-deps)"; exit 2; fi
done
for m in $modules; do
	allowed=" $m $(deps_of "$m") "
	for f in "$m"/*.c "$m"/*.h; do
		[ -e "$f" ] || continue
		key="extra_${f//[\/.]/_}"
		extra=" ${!key-} "
		while IFS=: read -r line inc; do
			dir=${inc%%/*}
			[ "$dir" = "$inc" ] && continue # "x.h" without a folder: same folder
			if [[ "$allowed$extra" != *" $dir "* ]]; then
				echo "$f:$line: includes \"$inc\": $m may not depend on $dir"
				bad=1
			elif [ "$dir" != "$m" ] && [[ "$inc" == *_i.h ]]; then
				echo "$f:$line: includes \"$inc\": another folder's internal header"
				bad=1
			fi
		done < <(grep -n '^#include "' "$f" | sed -E 's/^([0-9]+):#include "([^"]+)".*/\1:\2/')
	done
done
# The declared graph must be acyclic: peel off modules whose dependencies
# are all peeled.
done_=" "
left="$modules"
while [ -n "$left" ]; do
	next=""; progress=0
	for m in $left; do
		ok=1
		for d in $(deps_of "$m"); do [[ "$done_" == *" $d "* ]] || ok=0; done
		if [ $ok = 1 ]; then done_="$done_$m "; progress=1; else next="$next $m"; fi
	done
	left=$(echo $next)
	if [ $progress = 0 ]; then echo "check-deps: the graph has a cycle among: $left"; bad=1; break; fi
done
[ $bad = 0 ] && echo "check-deps: every include follows the graph ($modules)"
exit $bad
