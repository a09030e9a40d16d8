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
        atomic { !held -> held = 1; holding = 1 };
        CRASH(RUNNER);
        /* with_turn's begin, under the lock: a committed turn ID replays; a row moved,
           cancelled or settled meanwhile voids the fire. */
        atomic {
            tid = TURN_ID(mydue);
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

/* The clock: to MAXT, then on while a claim is pending (its expiry comes). Each
   runner claims again only after its turn ends, and a fired row is gone: time
   stays bounded (200 only keeps a byte from wrapping, in a mutant). */
active proctype clock()
{
end:
    do
    :: atomic { now < MAXT || (due != NONE && claimed_until > now && now < 200) -> now++ }
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
            :: set_by[d] && !voided[d] && fires[d] != 1 -> lost++
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
        run runner()
#endif
    }
}
