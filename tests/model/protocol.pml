/*
 * protocol.pml - a model of the control plane of a job of many nodes, for
 * spin (make test runs it: tests/model/check.sh).
 *
 * What stands for what:
 *   the globals under "etcd"     the job's keys: config and the attempt id
 *                                that committed it (commit txn), attempt,
 *                                leases (nodes/<id>)
 *   vote[]                       the coordinator's votebox
 *                                (cluster/mlfs_votebox.c): each node's last
 *                                vote, delivered to the coordinator's peer
 *                                server, in its memory; lost when the
 *                                coordinator restarts (its attempt with it),
 *                                kept when a participant does. A vote the
 *                                peer server did not take goes into the
 *                                node's entry instead (mlfs_attempt.c's
 *                                vote_in_entry): the same fact by another
 *                                path, counted only for the attempt id it
 *                                names; losing it with the node's lease
 *                                can only delay the decision, as a vote
 *                                never sent does, so it is not modelled
 *   proctype node                a daemon's control thread: each step reads
 *                                a snapshot and acts as mlfs_decide
 *                                (cluster/mlfs_decide.c) says, rules 2-8.
 *                                Rule 8 is modelled as each node's own
 *                                check that every participant swapped (the
 *                                daemon learns it from the participant's
 *                                swap ack to the coordinator or its entry,
 *                                both sent only after the swap); the
 *                                daemon's others release on the "released"
 *                                key put by the node that checked it (the
 *                                coordinator of the commit), the same fact
 *                                later (at their next round, within a
 *                                second; a round may come any time in the
 *                                model). A death after every swap
 *                                is outside rule 8 either way: a node that
 *                                read the entries itself saw a death only
 *                                when its lease expired, 5 s later.
 *   proctype proposer            a config.json write on a node (the attempt
 *                                transaction of cluster/mlfs_propose.c)
 *   proctype env                 the world: a lease expiring (a node frozen
 *                                or cut off), a daemon killed and restarted
 *                                without its memory, etcd unreachable
 *
 * Data: two units of state, A and B, placed by each layout on some nodes
 * (places()); a node holds the units its current layout places on it, and
 * those of the previous layout it retains after a commit, in memory only.
 *
 * Safety, checked in every state or at every drop:
 *   stale   a node serving version 2 serves the layout etcd committed for
 *           version 2 (the same attempt id), never another one;
 *   loss    a node never drops a layout (at a swap or a release) while it
 *           holds the last copy of a unit on a live node;
 *   abort   an attempt that is discarded leaves the node's layout as it was.
 * With -DOLD_RULES the rules before issue 17 (commit when the version
 * matches; drop the old layout at one's own swap): spin finds both
 * violations (tests/model/check.sh checks that it does).
 */

#define N 3
#define ATTEMPTS 2 /* attempt ids 1 and 2, both to version 2 */

/* ---------------------------------------------------------------- etcd */
byte committed = 1;   /* the version of "config" */
byte commit_id = 0;   /* the attempt that committed it (0: the first config) */
byte att_id = 0;      /* the attempt in progress (0: none) */
byte att_coord;       /* its coordinator, whose lease it is bound to */
bool part[N];         /* its participants */
bool up[N];           /* lease alive (nodes/<id> exists) */
bool waited[N];       /* took part in the last commit */
bool etcd_ok = true;

/* ------------------------------------------------ the coordinator's box */
byte vote[N];         /* the attempt id each node voted ready on */

/* --------------------------------------------------------------- nodes */
byte have[N];        /* version served (0: restarted, nothing yet) */
byte have_id[N];     /* the attempt id its layout came from */
byte prep_id[N];     /* the attempt the store prepared (0: none) */
bool lost[N];        /* its partitions are not the job's */
byte ret_id[N];      /* retained previous layout's id (255: none) */
bool expired[N];     /* its lease expired: it registers again first */

/* Whether layout @id places unit @u (0: A, 1: B) on node @n. The first
 * config: A on n0 and n1, B on n2. Attempt 1: A on n2, B on n0 (without
 * n1). Attempt 2: A on n1, B on n0 (without n2). */
#define places(id, n, u) \
	((id) == 0 && (((u) == 0 && (n) != 2) || ((u) == 1 && (n) == 2)) || \
	 (id) == 1 && (((u) == 0 && (n) == 2) || ((u) == 1 && (n) == 0)) || \
	 (id) == 2 && (((u) == 0 && (n) == 1) || ((u) == 1 && (n) == 0)))

/* A live copy of unit u other than node n's layout id (being dropped). */
#define copy_at(m, u, n, id) \
	(((m) != (n) || have_id[m] != (id)) && !lost[m] && have[m] != 0 && \
	 places(have_id[m], m, u) || \
	 ((m) != (n) || ret_id[m] != (id)) && ret_id[m] != 255 && places(ret_id[m], m, u))
#define other_copy(u, n, id) (copy_at(0, u, n, id) || copy_at(1, u, n, id) || copy_at(2, u, n, id))

/* Node n drops layout id: no unit it holds there may be the last copy
 * (-DNO_LOSS leaves it out, to check the claim alone). */
#ifdef NO_LOSS
#define drop_check(n, id) skip
#else
#define drop_check(n, id) \
	assert(!places(id, n, 0) || other_copy(0, n, id)); \
	assert(!places(id, n, 1) || other_copy(1, n, id))
#endif

inline decide(n)
{
	d_step {
		if
		:: !etcd_ok -> skip /* rule 1: nothing is decided */
		:: else ->
			if
			:: !up[n] -> up[n] = true; expired[n] = true /* rule 2: register */
			:: else -> expired[n] = false
			fi;
			if
			:: have[n] == 0 -> /* rule 5: started without memory */
				have[n] = committed; have_id[n] = commit_id;
				lost[n] = true /* the job saved state (step written at v1) */
			:: else ->
				committing = false;
				if
				:: prep_id[n] != 0 && committed >= 2 ->
#ifdef OLD_RULES
					if
					:: committed == 2 -> goto commit
					:: else -> goto discard
					fi;
#else
					if
					:: commit_id == prep_id[n] -> goto commit
					:: else -> goto discard
					fi;
#endif
				commit:
					/* rule 3: etcd committed this very attempt */
#ifdef OLD_RULES
					drop_check(n, have_id[n]);
#else
					if
					:: ret_id[n] != 255 -> drop_check(n, ret_id[n])
					:: else -> skip
					fi;
					ret_id[n] = (lost[n] -> 255 : have_id[n]);
#endif
					have[n] = 2; have_id[n] = prep_id[n]; prep_id[n] = 0;
					committing = true;
					goto decided;
				discard:
					prep_id[n] = 0; /* abort: the layout stays as it was */
					assert(have[n] != 1 || have_id[n] == 0);
					assert(have[n] != 2 || have_id[n] == commit_id);
				decided:
					skip
				:: prep_id[n] != 0 && committed < 2 && att_id != prep_id[n] ->
					prep_id[n] = 0 /* the attempt vanished without a commit */
				:: else -> skip
				fi;
				/* rule 4: missed a commit */
				if
				:: have[n] < committed && !committing -> lost[n] = true
				:: else -> skip
				fi;
				/* rule 6: take part */
				if
				:: att_id != 0 && part[n] && !expired[n] && vote[n] != att_id ->
					if
					:: prep_id[n] == att_id -> vote[n] = att_id
					:: prep_id[n] == 0 && have[n] == 1 -> prep_id[n] = att_id
					:: else -> skip
					fi
				:: else -> skip
				fi;
				/* rule 7: the coordinator */
				if
				:: att_id != 0 && att_coord == n ->
					if
					:: (part[0] && !up[0]) || (part[1] && !up[1]) || (part[2] && !up[2]) ->
						att_id = 0 /* a participant is down: abort */
					:: (!part[0] || vote[0] == att_id) && (!part[1] || vote[1] == att_id) &&
					   (!part[2] || vote[2] == att_id) ->
						committed = 2; commit_id = att_id;
						waited[0] = part[0]; waited[1] = part[1]; waited[2] = part[2];
						att_id = 0
					:: else -> skip
					fi
				:: else -> skip
				fi;
				/* rule 8: release the previous layout */
				if
				:: ret_id[n] != 255 &&
				   (!waited[0] || (up[0] && !lost[0] && have[0] == 2)) &&
				   (!waited[1] || (up[1] && !lost[1] && have[1] == 2)) &&
				   (!waited[2] || (up[2] && !lost[2] && have[2] == 2)) ->
					drop_check(n, ret_id[n]);
					ret_id[n] = 255
				:: else -> skip
				fi
			fi
		fi
	}
}

proctype node(byte n)
{
	bool committing;
	do
	:: decide(n)
	od
}

/* Whether node n is up and holds the job's state (a config may place
 * ranks on it: the propose refuses one that places ranks on a node down
 * or lost). */
#define usable(n) (up[n] && !lost[n] && have[n] == committed)
#define hosts(id, n) (places(id, n, 0) || places(id, n, 1))

/* A config.json write on node c: attempt @id from version 1 to 2, every
 * node up taking part (created only while no attempt is in progress, the
 * config is still at version 1, and every node the new layout uses is
 * usable). */
proctype proposer(byte c; byte id)
{
	atomic {
		etcd_ok && up[c] && att_id == 0 && committed == 1 && have[c] == 1 &&
		(!hosts(id, 0) || usable(0)) && (!hosts(id, 1) || usable(1)) &&
		(!hosts(id, 2) || usable(2)) ->
		att_id = id; att_coord = c;
		part[0] = up[0]; part[1] = up[1]; part[2] = up[2]
	}
}

/* The world: leases expire (frozen or cut off nodes), a daemon is killed
 * and restarted, etcd is unreachable for a while. Bounded. */
proctype env()
{
	byte expiries = 0, crashes = 0, outages = 0, k;
	do
	:: expiries < 2 ->
		atomic {
			select(k : 0 .. N - 1);
			if
			:: up[k] -> up[k] = false; expiries++;
				if
				:: att_id != 0 && att_coord == k -> att_id = 0 /* the attempt goes with it */
				:: else -> skip
				fi
			:: else -> skip
			fi
		}
	:: crashes < 1 ->
		atomic {
			select(k : 0 .. N - 1);
			crashes++;
			up[k] = false; have[k] = 0; have_id[k] = 0; prep_id[k] = 0;
			ret_id[k] = 255; lost[k] = false;
			if
			:: att_id != 0 && att_coord == k ->
				att_id = 0; /* its attempt goes with its lease, its box with it */
				vote[0] = 0; vote[1] = 0; vote[2] = 0
			:: else -> skip /* its vote stays in the coordinator's box */
			fi
		}
	:: outages < 1 -> etcd_ok = false; outages++; etcd_ok = true
	:: break
	od
}

/* stale: a node at version 2 serves the layout etcd committed for it. */
ltl stale { [] ((have[0] != 2 || have_id[0] == commit_id) &&
		(have[1] != 2 || have_id[1] == commit_id) &&
		(have[2] != 2 || have_id[2] == commit_id)) }

init {
	atomic {
		byte i;
		for (i : 0 .. N - 1) {
			have[i] = 1; up[i] = true; ret_id[i] = 255
		}
		run env();
		run proposer(0, 1);
		run proposer(1, 2);
		for (i : 0 .. N - 1) {
			run node(i)
		}
	}
}
