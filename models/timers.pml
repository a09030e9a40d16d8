/*
 * Timers (issue 37), for SPIN: set with a turn, claimed with a lease, fired once.
 *
 * The design the timers branch builds: a timer row (thread, key, due) is written by
 * the commit of the turn that set it; runners claim a due timer for a while
 * (claimed_until); a claimed timer fires as a turn whose ID is derived from (thread,
 * key, due), under the thread's lock, and that turn's commit settles the row. A
 * runner killed after its claim is taken over once the claim expires; a duplicate
 * claim runs the same turn ID, which replays. Setting the key again moves the timer;
 * cancelling it removes the row. A turn is taken as turn_protocol.pml proves it:
 * under the lock, committed once per turn ID; here the lock is exclusive, and a
 * crash drops it.
 *
 * One thread, one key K. A setter's first turn sets K due at time 1; its second
 * turn moves K to time 2, cancels it, or leaves it. Two runners poll. A clock ticks
 * from 0 to MAXT, and on while a claim is pending: a runner may pause past its claim
 * (time passes between any two of its steps). The timer's turn applies one effect
 * through a receipt keyed by its turn ID (prepared, then completed): a takeover
 * after a crash finds the receipt and does not apply it again.
 *
 * Crash points: after the claim, after the lock, after the receipt is prepared,
 * after the provider applied the effect, before and after the commit; and in the
 * setter's turns, after the lock and before the commit.
 *
 * Properties (assertions; pan's report names the expression):
 *   (applied[d]<=1)    no timer's effect is applied twice;
 *   (fires[d]<=1)      no timer's turn commits twice (per key and due);
 *   (!(voided[d]))       a timer moved or cancelled by a committed turn never fires
 *                      at its old time;
 *   (set_by[d])        only a timer set by a committed turn fires;
 *   (lost==0)          when nothing can move any more, every timer set and neither
 *                      moved nor cancelled has fired, once, and no row is left.
 *
 * -DINBOX (issue 37, round 3): the agent keeps a thread inbox. A runner that finds the
 * thread busy queues the timer's turn ID there (idempotent) instead of waiting, and
 * keeps its claim. A drainer (any process; one killed is replaced) takes an entry
 * under the thread's lock, marks it started, fires it as a runner does, and removes
 * it after the commit. A direct fire under the lock marks an entry of its turn ID
 * started too (start_queued). A canceller cancels one occurrence's turn ID: an entry
 * not started is removed and the cancel recorded in one transaction ("dequeued"),
 * and then the row is settled under the lock; else the cancel is only recorded
 * ("requested"). A fire that finds a cancel recorded as it starts settles the row
 * and runs nothing. Extra properties:
 *   !(dequeued[tid]) as a fire starts: no occurrence starts after a cancel dequeued it;
 *   (lost==0) also when an occurrence's cancel was recorded: its row is settled (a
 *   cancelled occurrence need not fire), and no inbox entry is left.
 * Mutant -DNO_CANCEL_CHECK: a fire does not read the cancel as it starts; it must
 * break the first property. Not claimed: a worker whose claim lapsed may queue the
 * turn ID while another runs it directly, and a cancel then dequeues that entry
 * although the turn runs (as a redelivery of a person's turn queued in another
 * process). It runs once even so: the cancel only removes the entry.
 *
 * Mutants (-D...): SETTLE_OUTSIDE (the row deleted by key after the turn's commit,
 * in a transaction of its own), FRESH_TURN_ID (a turn ID per claim), NO_CLAIM_EXPIRY
 * (a claim is never taken over), NO_ROW_CHECK (the turn fires what was claimed,
 * without reading the row under the lock), SET_OUTSIDE_TURN (the row written before
 * the setter's turn commits). Each must produce a counterexample.
 */

#ifndef MAX_CRASH
#define MAX_CRASH 3
#endif
#ifndef MAXT
#define MAXT 4                   /* the clock's last tick, unless a claim is pending */
#endif
#define LEASE 1                  /* a claim lasts this many ticks */
#ifndef NR
#define NR 3                     /* runners */
#endif
#define NONE 0

/* -- the store ------------------------------------------------------------------------- */
byte due;                        /* ik_timers row of K: its due time (NONE: no row) */
byte claimed_until;              /* the claim's end (0: unclaimed) */
bit turn_row[16];                 /* ik_turns: the timer's turn IDs committed */
byte receipt[16];                 /* the effect's receipt per turn ID: 0, 1 prepared, 2 done */
bit held;                        /* the thread's lock */
byte now;                        /* the clock */
byte crashes;
byte dead;                       /* runners crashed */
byte claims;                     /* claims made (FRESH_TURN_ID numbers its turn IDs) */
byte ended;                      /* the setter ended */
#ifdef INBOX
bit inq[3];                      /* the inbox: an entry per turn ID (the due time) */
bit started[3];                  /* its entry was marked started */
bit cancel_rec[3];               /* a cancel recorded for the turn ID */
bit dequeued[3];                 /* ghost: a cancel removed the entry, not started */
byte dcrashes;                   /* drainers killed (a new one takes over) */
#endif

/* -- ghosts ---------------------------------------------------------------------------- */
byte applied[3];                 /* applications of the effect of the timer due at d */
byte fires[3];                   /* commits of the timer's turn due at d */
bit voided[3];                     /* the timer due at d was moved or cancelled, unfired */
bit set_by[3];                   /* a committed turn set the timer due at d */
byte lost;

/* A crash: the setter's, or a runner's while another runner lives (the fleet
   goes on: some runner polls). */
#define CRASH(who) \
    if \
    :: skip \
    :: atomic { \
            crashes < MAX_CRASH && (who == SETTER || dead < NR - 1) -> \
            crashes++; dead = dead + (who == RUNNER) \
        }; \
        goto crashed \
    fi
#define SETTER 1
#define RUNNER 2

#ifdef NO_CLAIM_EXPIRY
#define CLAIMABLE (due != NONE && due <= now && claimed_until == 0)
#else
#define CLAIMABLE (due != NONE && due <= now && claimed_until <= now)
#endif

/* A cancel recorded for turn ID t, as a fire reads it when it starts. */
#ifdef NO_CANCEL_CHECK
#define CANCELLED(t) false
#else
#define CANCELLED(t) cancel_rec[t]
#endif

/* The timer's turn ID: derived from (thread, key, due); FRESH_TURN_ID: per claim. */
#ifdef FRESH_TURN_ID
#define TURN_ID(d) ((d) + 3 * (myclaim - 1))
#else
#define TURN_ID(d) (d)
#endif

proctype runner()
{
    byte mydue;
    byte myclaim;
    byte tid;
    bit holding;
    bit call;

end:
    do
    :: atomic {
            CLAIMABLE ->
#ifdef FRESH_TURN_ID
            claims++; myclaim = claims;
#endif
            mydue = due; claimed_until = now + LEASE
        };
        CRASH(RUNNER);
#ifdef INBOX
        /* The inbox read, then one attempt at the lock: busy (or an entry waits), the
           timer's turn ID is queued and the claim kept; a drainer runs it. */
        if
        :: atomic { !inq[mydue] && !held -> held = 1; holding = 1 }
        :: atomic { inq[mydue] || held -> inq[mydue] = 1 }; goto next
        fi;
#else
        atomic { !held -> held = 1; holding = 1 };
#endif
        CRASH(RUNNER);
        /* with_turn's begin, under the lock: a committed turn ID replays; a row moved,
           cancelled or settled meanwhile voids the fire. */
        atomic {
            tid = TURN_ID(mydue);
#if defined(INBOX) && !defined(START_UNMARKED)
            if :: inq[tid] -> started[tid] = 1 :: else -> skip fi;
#endif
#ifdef INBOX
            /* ... and a cancel recorded before the start settles the row, runs nothing. */
            if
            :: turn_row[tid] -> goto release
            :: !turn_row[tid] && due != mydue -> goto release
            :: !turn_row[tid] && due == mydue && CANCELLED(tid) ->
                due = NONE; claimed_until = 0; goto release
            :: !turn_row[tid] && due == mydue && !CANCELLED(tid) -> assert(!(dequeued[tid]))
            fi;
#else
            if
#ifdef SETTLE_OUTSIDE
            :: turn_row[tid] -> goto settle          /* fired: settle it (again) */
#else
            :: turn_row[tid] -> goto release
#endif
#ifndef NO_ROW_CHECK
            :: due != mydue -> goto release
#endif
            :: else -> skip
            fi;
#endif
            /* The effect's receipt, keyed by the turn ID: a new one is prepared; one
               prepared before a crash may have been applied (uncertain: not again). */
            if
            :: receipt[tid] == 0 -> receipt[tid] = 1; call = 1
            :: else -> call = 0
            fi
        };
        CRASH(RUNNER);
        if
        :: call ->
            atomic { applied[mydue]++; assert(applied[mydue] <= 1) };
            CRASH(RUNNER);
            atomic { receipt[tid] = 2; call = 0 }
        :: else -> skip
        fi;
        CRASH(RUNNER);
        /* The commit: the turn row, and the timer's row settled in the same
           transaction (deleted if it still holds this due time). */
        atomic {
            assert(!(voided[mydue]));
            assert(set_by[mydue]);
            turn_row[tid] = 1; fires[mydue]++; assert(fires[mydue] <= 1);
#ifndef SETTLE_OUTSIDE
            if
            :: due == mydue -> due = NONE; claimed_until = 0
            :: else -> skip
            fi;
#endif
            held = 0; holding = 0
        };
        CRASH(RUNNER);
#ifdef SETTLE_OUTSIDE
        goto settle;
#endif
        goto next;
release:
        atomic { held = 0; holding = 0 };
        goto next;
#ifdef SETTLE_OUTSIDE
settle:
        atomic { if :: holding -> held = 0; holding = 0 :: else -> skip fi };
        CRASH(RUNNER);
        /* A transaction of its own, by key. */
        atomic { due = NONE; claimed_until = 0 };
#endif
next:
        atomic { mydue = 0; myclaim = 0; tid = 0 }
    od;
crashed:
    atomic {
        if :: holding -> held = 0; holding = 0 :: else -> skip fi
    }
}

/* Two turns on the thread: the first sets K due at 1; the second moves it to 2,
   cancels it, or leaves it. A turn that crashes commits nothing (and sets nothing). */
proctype setter()
{
    byte to;
    bit holding;

    atomic { !held -> held = 1; holding = 1 };
#ifdef SET_OUTSIDE_TURN
    atomic { due = 1; claimed_until = 0 };
#endif
    CRASH(SETTER);
    atomic {
        due = 1; claimed_until = 0; set_by[1] = 1;
        held = 0; holding = 0
    };
    if
    :: to = 2
    :: to = NONE
    :: goto done
    fi;
    atomic { !held -> held = 1; holding = 1 };
    CRASH(SETTER);
    atomic {
        /* The move (or the cancel) replaces a row not yet fired; a fired timer's row
           is gone, and setting the key again is a new timer. */
        if
        :: due != NONE -> voided[due] = 1
        :: else -> skip
        fi;
        due = to; claimed_until = 0;
        if :: to != NONE -> set_by[to] = 1 :: else -> skip fi;
        held = 0; holding = 0
    };
    goto done;
crashed:
    atomic {
        if :: holding -> held = 0; holding = 0 :: else -> skip fi
    };
done:
    ended = 1
}

#ifdef INBOX
/* A crash of a drainer or the canceller: it drops the lock; a drainer's process is
   replaced by another one that drains (the thread's next turn does). */
#define OTHER_CRASH(where) \
    if \
    :: skip \
    :: atomic { crashes < MAX_CRASH -> crashes++ }; goto where \
    fi

/* Drains the thread's inbox: an entry at a time, under the lock, marked started as
   it starts; fired as a runner fires; removed after the commit. */
proctype drainer()
{
    byte d;
    bit holding;
    bit call;

end:
    do
    :: atomic {
            !held && (inq[1] || inq[2]) -> held = 1; holding = 1;
            if :: inq[1] -> d = 1 :: inq[2] -> d = 2 fi;
            started[d] = 1
        };
        OTHER_CRASH(dcrashed);
        atomic {
            if
            :: turn_row[d] -> goto drelease          /* committed: replayed */
            :: !turn_row[d] && due != d -> goto drelease    /* stale: nothing runs */
            :: !turn_row[d] && due == d && CANCELLED(d) ->
                due = NONE; claimed_until = 0; goto drelease
            :: !turn_row[d] && due == d && !CANCELLED(d) -> assert(!(dequeued[d]))
            fi;
            if
            :: receipt[d] == 0 -> receipt[d] = 1; call = 1
            :: else -> call = 0
            fi
        };
        OTHER_CRASH(dcrashed);
        if
        :: call ->
            atomic { applied[d]++; assert(applied[d] <= 1) };
            OTHER_CRASH(dcrashed);
            atomic { receipt[d] = 2; call = 0 }
        :: else -> skip
        fi;
        OTHER_CRASH(dcrashed);
        atomic {
            assert(!(voided[d]));
            assert(set_by[d]);
            turn_row[d] = 1; fires[d]++; assert(fires[d] <= 1);
            if
            :: due == d -> due = NONE; claimed_until = 0
            :: else -> skip
            fi;
            held = 0; holding = 0
        };
        OTHER_CRASH(dcrashed);
        goto dremove;
drelease:
        atomic { held = 0; holding = 0 };
dremove:
        /* Removed only after the commit: a crash before leaves it, to be replayed. */
        atomic { inq[d] = 0; d = 0 };
        goto dnext;
dcrashed:
        atomic { if :: holding -> held = 0; holding = 0 :: else -> skip fi; d = 0; call = 0 };
dnext:
        skip
    od
}

/* Kernel.cancel of one occurrence's turn ID: an entry not started is removed and the
   cancel recorded in one transaction (then the row settled under the lock); else
   the cancel is only recorded. */
proctype canceller()
{
    byte d;
    bit holding;

    if :: d = 1 :: d = 2 fi;
    if
    :: atomic { inq[d] && !started[d] -> inq[d] = 0; cancel_rec[d] = 1; dequeued[d] = 1 };
        OTHER_CRASH(ccrashed);
        atomic { !held -> held = 1; holding = 1 };
        atomic {
            if :: due == d -> due = NONE; claimed_until = 0 :: else -> skip fi;
            held = 0; holding = 0
        }
    :: atomic { !(inq[d] && !started[d]) -> cancel_rec[d] = 1 }
    fi;
    goto cdone;
ccrashed:
    skip;
cdone:
    skip
}
#endif

/* The clock: to MAXT, then on while a claim is pending (its expiry comes). Each
   runner claims again only after its turn ends, and a fired row is gone: time
   stays bounded (200 only keeps a byte from wrapping, in a mutant). */
active proctype clock()
{
end:
    do
#ifdef INBOX
    /* A claim whose turn ID waits in the inbox keeps time still past MAXT: its drain
       waits only for the lock. Re-claims of a queued timer are explored up to MAXT. */
    :: atomic {
            now < MAXT || (due != NONE && claimed_until > now && !inq[due] && now < 200) ->
            now++
        }
#else
    :: atomic { now < MAXT || (due != NONE && claimed_until > now && now < 200) -> now++ }
#endif
    od
}

/* When nothing can move any more: nothing set was lost. */
active proctype check()
{
    byte d;
    timeout ->
    atomic {
        for (d : 1 .. 2) {
            if
#ifdef INBOX
            :: set_by[d] && !voided[d] && !cancel_rec[d] && fires[d] != 1 -> lost++
            :: inq[d] -> lost++
#else
            :: set_by[d] && !voided[d] && fires[d] != 1 -> lost++
#endif
            :: else -> skip
            fi
        };
        if :: due != NONE -> lost++ :: else -> skip fi;
        assert(lost == 0)
    }
}

init
{
    atomic {
        run setter();
        run runner();
        run runner();
#if NR > 2
        run runner();
#endif
#ifdef INBOX
        run drainer();
        run canceller();
#endif
        skip
    }
}
