/*
 * The turn protocol of intention-kernel, as the code implements it, for SPIN.
 *
 * One thread, one effect key K, three workers and an operator:
 *   - workers 1 and 2 deliver the same turn ID (T1), worker 3 another one (T2);
 *   - every worker runs RecordedDurability.with_turn (durability/_engine/recorded.py): the
 *     thread lock, the read of the turn row and the thread, the operation, the
 *     fenced commit; its operation asks the model one round, recorded in the
 *     turn's journal before any step runs (tx.recorded), and calls run_effect(K) (_run_effect, and the
 *     receipt rules of _effects.py: plan_effect, settle);
 *   - the operator resolves K's receipt through the host (resolve_receipt in
 *     host/_endpoints.py, then RecordedDurability.resolve_receipt under the lock).
 *
 * The init process picks one of two scenarios (both are explored):
 *   CONFIRM     the thread is at version 1, owned by tenant A, with a pending
 *               confirmation; every delivery is the person's "yes" (_runtime/answer.py):
 *               a turn that loads the pending confirmation closes it and runs the
 *               stored operation (K); one that finds none commits a turn that ran nothing;
 *   FIRST_TURN  the thread has no committed turn and no receipt (nobody owns it);
 *               every delivery pays at once (a "capability"-mode write): K runs in
 *               every turn, deduplicated by its receipt.
 *
 * Crash labels: each label named after a fault point of src/intention_kernel/_faults.py
 * is followed by POINT, where the worker may crash (its process dies), lose its lock's
 * session (PostgreSQL: the server drops the lock, every later statement on the
 * session fails) or go on. tests/test_protocol_model.py checks that the labels
 * followed by POINT (or COMMIT_POINT) are exactly _faults.POINTS.
 *
 * Properties (assertions; the expression names the property in pan's report):
 *   (applied_since_na<=1)  no provider application twice for K without an
 *                          operator's "not applied" in between;
 *   (commits[t]<=1)        no two commits of one turn ID;
 *   (seen==total_commits)  no commit by a worker that lost its claim: nothing was
 *                          committed since it loaded the thread (and it commits
 *                          only on its own live session);
 *   (op_runs<=1)           the accepted operation runs (is committed as run) once;
 *   (rtenant==principal)   a receipt is resolved only by a principal of its tenant;
 *   (!journal[t]||!EXCLUSIVE) a model round recorded in the journal is never asked
 *                          again (by a worker whose claim is exclusive);
 * and the LTL claim lock_released: a lock held by a dead worker is released.
 *
 * Mutants (compile with -D...): NO_FENCE, RETRY_PREPARED, NO_LOCK,
 * TENANT_OUTSIDE_LOCK, LIVE_RESOLVE, NO_JOURNAL_READ. Each must produce a counterexample.
 *
 * LEASES (compile with -DLEASES): PostgreSQL's thread leases (durability/postgres/
 * _leases.py) in place of a lock held by a session. The lease has an epoch that each
 * grant increments, and is live until it lapses. A worker may pause at any durable
 * point for longer than its lease (MAX_PAUSE): the lease lapses, and another worker
 * may take the thread before it wakes. Its renewal (RENEW, between durable points)
 * extends only a lease still live at its own epoch. Every write of a turn (receipt
 * prepare, journal entry, commit) checks the lease in the same atomic step (FENCE);
 * the outcome of a provider call is fenced by its attempt instead (SETTLE). A dead
 * worker's lease lapses (its expiry). Two more properties:
 *   (!lost[me])            no write by a worker that lost its lease;
 *   (paused[me]||!lost[me]) a worker that never paused never loses its lease (its
 *                          renewals come at a third of the expiry);
 * and four more mutants: UNFENCED_PREPARE, UNFENCED_JOURNAL, RENEW_NO_EPOCH (renewal
 * extends whatever lease the row holds, a lapsed one of its own included) and
 * EXPIRY_SHORT (the lease may lapse between two renewals of a running worker).
 */

#ifndef MAX_CRASH
#define MAX_CRASH 2      /* worker processes that die, in all */
#endif
#ifndef MAX_LOSS
#define MAX_LOSS 1       /* lock sessions that die under a live worker */
#endif
#ifndef MAX_DOUBLE
#define MAX_DOUBLE 1     /* grants of a lock already held (a lock that fails to exclude) */
#endif
#ifndef MAX_RESOLVE
#define MAX_RESOLVE 2    /* the operator's resolution requests */
#endif
#ifndef MAX_PAUSE
#define MAX_PAUSE 1      /* pauses past the lease's expiry (LEASES) */
#endif

#define NW 3             /* workers 1..NW */
#define OP 4             /* the operator's lock identity */

#define TNONE 0          /* no tenant: the tenant-less operator token */
#define TA 1             /* tenant A: every delivery, and the operator's tenant token */

#define CONFIRM 1
#define FIRST_TURN 2

mtype = { NONE, PREPARED, COMPLETED, FAILED, UNCERTAIN };

/* -- the store ------------------------------------------------------------------------ */
byte scenario;
byte version;            /* ik_threads.version */
byte thread_tenant;      /* ik_threads.tenant_id, set by the first commit */
bit pending;             /* the committed checkpoint holds the pending confirmation */
bit turn_row[3];         /* ik_turns (thread, turn) primary key, turns 1 and 2 */
bit journal[3];          /* ik_journal: the turn's model round is recorded (turns 1 and 2) */
mtype rstatus = NONE;    /* K's receipt: status, attempt, tenant */
byte rattempt;
byte rtenant;

/* -- the lock and the processes --------------------------------------------------------- */
bit held[OP + 1];        /* who the server (or the OS) counts as holding the thread lock */
bit alive[NW + 1];       /* the worker's process runs */
bit sess[OP + 1];        /* its lock session is up */
byte crashes;
byte losses;
byte doubles;
byte pauses;

/* -- the lease (LEASES): its row in ik_leases ------------------------------------------- */
byte lease_epoch;        /* grows with each grant */
byte lease_holder;       /* who was granted the current epoch */
bit lease_live;          /* not lapsed, not released */
bit paused[NW + 1];      /* ghost: the worker paused past its lease at least once */

/* -- ghosts: what the properties count --------------------------------------------------- */
byte applied_since_na;   /* provider applications of K since the last "not applied" */
byte commits[3];         /* commits per turn ID */
byte total_commits;
byte op_runs;            /* committed turns that ran the accepted operation */
byte asks[3];            /* model requests for the turn's round */
bit lost[NW + 1];        /* the worker's claim is not exclusive: its session died, or the
                            lock was granted to another while it held it, or to it while
                            another held it */
bit in_call[NW + 1];     /* the worker's attempt is prepared and its provider call
                            has not ended: it may still reach the provider */

/* The worker's claim on the thread excludes every other (see lost[]); without a
   lock (the NO_LOCK mutant) no claim does. */
#ifdef NO_LOCK
#define EXCLUSIVE 0
#else
#define EXCLUSIVE (!lost[me])
#endif
#ifdef LEASES
#define HELD_BY_ANYONE (lease_live)
#else
#define HELD_BY_ANYONE (held[1] || held[2] || held[3] || held[OP])
#endif
/* The thread's owner (ThreadOwner): the first commit's tenant, else the first
   receipt's, else nobody (TNONE: a thread nobody owns looks like the tenant-less
   caller's, as Access.sees reads it). */
#define OWNER (version > 0 -> thread_tenant : (rstatus != NONE -> rtenant : TNONE))
/* An attempt that outlived its claim and may still call the provider (issue 17,
   item 4: such a receipt must not be resolvable as not applied). */
#define LIVE_ATTEMPT_WITHOUT_CLAIM \
    ((alive[1] && in_call[1] && lost[1]) || (alive[2] && in_call[2] && lost[2]) || \
     (alive[3] && in_call[3] && lost[3]))

/* A statement on the worker's lock session: a dead session fails it, and the turn
   raises (StoreError) before anything else is written. */
#define STATEMENT if :: !sess[me] -> goto aborted :: else -> skip fi;

#ifdef LEASES
#define LEASE_OK (lease_live && lease_epoch == myepoch)
/* The holder's renewal (_renew): extends its lease only if it is still live at its own
   epoch; else the lease is lost for good. */
#ifdef RENEW_NO_EPOCH
#define RENEW if :: held[me] -> lease_live = 1 :: else -> skip fi
#else
#define RENEW \
    if \
    :: held[me] && !(lease_live && lease_epoch == myepoch) -> lost[me] = 1 \
    :: else -> skip \
    fi
#endif
#ifdef EXPIRY_SHORT
/* The lease may lapse between two renewals of a worker that runs on. */
#define LAPSE_RUNNING \
    :: held[me] && lease_live && lease_epoch == myepoch -> \
        atomic { lease_live = 0; lost[me] = 1 }
#else
#define LAPSE_RUNNING
#endif
/* A durable point of a turn: go on (renewing), crash, or pause past the lease's
   expiry (it lapses; others may take the thread before this worker goes on). */
#define POINT \
    if \
    :: RENEW \
    :: crashes < MAX_CRASH -> crashes++; goto crashed \
    :: pauses < MAX_PAUSE && held[me] && LEASE_OK -> \
        atomic { pauses++; paused[me] = 1; lease_live = 0; lost[me] = 1 } \
    LAPSE_RUNNING \
    fi
/* A pause anywhere else (not a fault point: no crash here): while a capability runs,
   say, between the model's answer and the effect's prepare. */
#define PAUSE \
    if \
    :: RENEW \
    :: pauses < MAX_PAUSE && held[me] && LEASE_OK -> \
        atomic { pauses++; paused[me] = 1; lease_live = 0; lost[me] = 1 } \
    LAPSE_RUNNING \
    fi
/* A write of a lease holder, fenced in the same statement: refused (LeaseLostError)
   unless its lease is live at its epoch. */
#define FENCE \
    assert(paused[me] || !lost[me]); \
    if :: !LEASE_OK -> goto aborted :: else -> skip fi;
/* The write itself: never by a worker that lost its lease. */
#define FENCED_WRITE assert(!lost[me]);
#else
/* A durable point of a turn: go on, crash, or lose the lock's session. */
#define POINT \
    if \
    :: skip \
    :: crashes < MAX_CRASH -> crashes++; goto crashed \
    :: losses < MAX_LOSS && held[me] && sess[me] -> \
        atomic { losses++; sess[me] = 0; lost[me] = 1; RELEASE_DEAD } \
    fi
#define FENCE
#define FENCED_WRITE
#define LEASE_OK 1
#define PAUSE skip
#endif

/* The commit's durable point: go on, or crash with the commit rolled back (SQLite,
   or PostgreSQL before the server ran it) or completed by the server (PostgreSQL). */
#define COMMIT_POINT \
    if \
    :: skip \
    :: crashes < MAX_CRASH -> \
        atomic { \
            crashes++; \
            if \
            :: skip \
            :: sess[me] && LEASE_OK && !FENCED -> COMMIT; LET_GO \
            fi \
        }; \
        goto crashed \
    fi

/* The provider's answer recorded (write_receipt). The call has ended. */
#define SETTLE \
    in_call[me] = 0; \
    if \
    :: rstatus == PREPARED && rattempt == myatt -> rstatus = outcome; myatt = 0 \
    :: else -> goto aborted                 /* FencedCommitError */ \
    fi; \
    if \
    :: outcome == COMPLETED -> outcome = NONE \
    :: else -> outcome = NONE; goto settled \
    fi

#define DEAD_HOLDER ((held[1] && !sess[1]) || (held[2] && !sess[2]) || (held[3] && !sess[3]))
#ifdef LEASES
/* A dead holder stops renewing: its lease lapses (at its expiry). */
#define RELEASE_DEAD if :: held[me] && lease_epoch == myepoch -> lease_live = 0 :: else -> skip fi
#elif defined(LOCK_RELEASE_DELAYED)
#define RELEASE_DEAD skip         /* the reaper process drops it, later */
#else
/* The lock of a dead session is dropped as it dies (the safety runs: a dead holder
   does nothing, so releasing its lock later would only make others wait). */
#define RELEASE_DEAD held[me] = 0
#endif

/* The fenced commit (commit_turn of both adapters): one transaction that inserts the
   turn row (primary key), compares-and-sets the thread version, writes the checkpoint
   and the events, and hands the lock over (PostgreSQL) or is followed by its release. */
#define COMMIT \
    assert(seen == total_commits); \
    turn_row[t] = 1; commits[t]++; total_commits++; journal[t] = 0; \
    assert(commits[t] <= 1); \
    if :: version == 0 -> thread_tenant = TA :: else -> skip fi; \
    version++; \
    if \
    :: ran -> pending = 0; op_runs++; assert(op_runs <= 1) \
    :: else -> skip \
    fi

#ifdef LEASES
/* Let go of the lease: only a lease still at its own epoch (RELEASE_LEASE names its
   owner, one grant). */
#define LET_GO if :: held[me] && lease_epoch == myepoch -> lease_live = 0 :: else -> skip fi
#else
#define LET_GO skip
#endif

#ifdef NO_FENCE
#define FENCED (turn_row[t])
#else
#define FENCED (turn_row[t] || version != myv)
#endif

proctype worker(byte me; byte t)
{
    byte myv;            /* the version this turn loaded */
    byte seen;           /* commits it had seen when it loaded the thread */
    byte myatt;          /* the attempt it prepared */
    byte myepoch;        /* the lease epoch it was granted (LEASES) */
    bit ran;             /* it ran the accepted operation (closed the confirmation) */
    bit runs_k;          /* its operation calls run_effect(K) */
    bit recorded;        /* it found its round in the journal */
    mtype outcome = NONE;

    /* PostgreSQL's ik_start_turn reads the committed turn first, without the lock:
       found, the delivery replays and writes nothing. Else the lock: exclusive,
       unless it fails to exclude (a second grant). */
    atomic {
        if
        :: turn_row[t] -> goto done
#ifdef NO_LOCK
        :: else -> sess[me] = 1
#elif defined(LEASES)
        /* ik_start_turn_leased: the lease, only if it lapsed; a new epoch. */
        :: !turn_row[t] && !lease_live ->
            lease_epoch++; myepoch = lease_epoch; lease_holder = me; lease_live = 1;
            held[me] = 1; sess[me] = 1
#else
        :: !turn_row[t] && !HELD_BY_ANYONE -> held[me] = 1; sess[me] = 1
        :: !turn_row[t] && HELD_BY_ANYONE && doubles < MAX_DOUBLE ->
            /* neither claim is exclusive: the holders' nor this one */
            doubles++;
            lost[1] = lost[1] || held[1]; lost[2] = lost[2] || held[2];
            lost[3] = lost[3] || held[3]; lost[me] = 1;
            held[me] = 1; sess[me] = 1
#endif
        fi
    }
after_lock: POINT;
    /* begin_turn, under the lock, on its session: the turn row, else the thread. */
    atomic {
        STATEMENT
        if
        :: turn_row[t] -> goto release      /* committed meanwhile: replay */
        :: else -> skip
        fi;
        myv = version; seen = total_commits;
        /* with_turn's tenant check: the thread is tenant A's or nobody's. */
        assert(OWNER == TA || OWNER == TNONE);
        runs_k = (scenario == FIRST_TURN || pending);
        ran = (scenario == CONFIRM && pending)
    }
after_checkpoint_load: POINT;
    /* The model round of a turn in rounds (_runtime/journal.py): the journal is read on
       the lock's session; a round found there is not asked again; else the model is
       asked (outside any statement: it takes long) and its answer recorded
       (write_journal: one insert on the lock's session, a key already there refused,
       FencedCommitError) before any step of the round runs. */
    atomic {
        STATEMENT
#ifdef NO_JOURNAL_READ
        recorded = 0
#else
        recorded = journal[t]
#endif
    };
    if
    :: recorded -> skip
    :: else ->
        atomic { assert(!journal[t] || !EXCLUSIVE); asks[t]++ };
        atomic {
            STATEMENT
#ifndef UNFENCED_JOURNAL
            FENCE
#endif
            FENCED_WRITE
            if
            :: journal[t] -> goto aborted
            :: else -> journal[t] = 1
            fi
        }
    fi;
    PAUSE;
    /* run_effect(K), if the operation calls it. claim_effect: read K's receipt, plan
       it (plan_effect), persist the plan's write, in one transaction on the turn's
       session. On PostgreSQL the read and the write are two statements. A
       compare-and-set that finds the receipt moved (a late SETTLE) reads and plans
       again. So the claim takes effect at its last read or at its write: this
       atomic step. */
    atomic {
        if
        :: !runs_k -> goto settled
        :: else -> runs_k = 0
        fi;
        STATEMENT
#ifndef UNFENCED_PREPARE
        FENCE
#endif
        FENCED_WRITE
        if
        :: rstatus == NONE ->
            rstatus = PREPARED; rattempt = 1; rtenant = TA; myatt = 1
        :: rstatus == COMPLETED -> goto settled     /* replay the stored value */
        :: rstatus == UNCERTAIN -> goto settled     /* fail closed */
        :: rstatus == PREPARED ->
#ifdef RETRY_PREPARED
            rattempt++; myatt = rattempt            /* retried as if it had failed */
#else
            rstatus = UNCERTAIN; goto settled       /* abandoned: it may have been applied */
#endif
        :: rstatus == FAILED ->                     /* proved not applied: retry */
            rstatus = PREPARED; rattempt++; myatt = rattempt
        fi;
        in_call[me] = 1
    }
after_receipt_prepared: POINT;
    /* The provider call: applied or not; its answer, or an exception. Then
       write_receipt: compare-and-set on the prepared status and attempt; on
       PostgreSQL, after the session died, once more on another session without the
       lock (_settle_again), under the same compare-and-set. */
    if
    :: atomic { applied_since_na++; assert(applied_since_na <= 1) };
in_provider_after_write: POINT;
        atomic {
            if
            :: outcome = COMPLETED          /* it answers */
            :: outcome = UNCERTAIN          /* the response is lost: an exception */
            fi;
            SETTLE
        }
    :: atomic {
            if
            :: outcome = FAILED             /* EffectNotAppliedError */
            :: outcome = UNCERTAIN          /* not applied, but it raised something else */
            fi;
            SETTLE
        }
    fi;
after_receipt_completed: POINT;
settled:
before_commit: POINT;
    /* The commit. On SQLite during_commit is inside the open transaction (a death
       there rolls it back); on PostgreSQL the statement is on its way, and the server
       may complete it after the worker died. */
during_commit: COMMIT_POINT;
    atomic {
        STATEMENT
        FENCE
        FENCED_WRITE
        if
        :: FENCED -> goto release           /* FencedCommitError */
        :: else -> COMMIT; LET_GO; held[me] = 0
        fi
    };
after_commit: POINT;
aborted:
release:
    /* The lock is released: unlocked on a live session; a dead one holds nothing. The
       lease is let go of (if still at its epoch). */
    atomic { LET_GO; held[me] = 0 };
    goto done;
crashed:
    atomic {
        alive[me] = 0; sess[me] = 0; in_call[me] = 0;
        RELEASE_DEAD
    };
done:
    skip
}

#if defined(LOCK_RELEASE_DELAYED) && !defined(LOCK_OUTLIVES_HOLDER) && !defined(LEASES)
/* The server, or the operating system, drops the locks of dead sessions and
   processes, some time after they died. (LOCK_OUTLIVES_HOLDER: nobody does, as with
   a lease row that has no expiry.) */
active proctype reaper()
{
    byte w;
end:
    do
    :: atomic {
        DEAD_HOLDER ->
        for (w : 1 .. NW) {
            if
            :: held[w] && !sess[w] -> held[w] = 0
            :: else -> skip
            fi
        }
       }
    od
}
#endif

/* The operator, through the host: resolve K's receipt on the thread, with the token
   of tenant A or a tenant-less one. The resolution is truthful: "applied" when the
   provider applied K, "not applied" when it did not. */
proctype operator()
{
    byte n;
    byte principal;
    bit visible;

    do
    :: n < MAX_RESOLVE ->
        n++;
#ifdef TENANT_OUTSIDE_LOCK
        /* Access.sees, before the lock */
        atomic {
            if
            :: principal = TA
            :: principal = TNONE
            fi;
            visible = (OWNER == principal)
        };
#endif
        /* RecordedDurability.resolve_receipt: the lock, one transaction, the unlock. */
        atomic {
#ifndef NO_LOCK
            !HELD_BY_ANYONE ->
#endif
#ifdef LEASES
            lease_epoch++; lease_holder = OP;    /* granted, and let go at the end */
#endif
#ifndef TENANT_OUTSIDE_LOCK
            if
            :: principal = TA
            :: principal = TNONE
            fi;
            visible = (OWNER == principal);     /* decided under the lock */
#endif
            if
            :: visible && (rstatus == UNCERTAIN || rstatus == PREPARED) ->
                if
                :: applied_since_na > 0 -> rstatus = COMPLETED; assert(rtenant == principal)
#ifdef LIVE_RESOLVE
                :: applied_since_na == 0 ->
#else
                :: applied_since_na == 0 && !LIVE_ATTEMPT_WITHOUT_CLAIM ->
#endif
                    rstatus = FAILED; applied_since_na = 0; assert(rtenant == principal)
                :: else -> skip                 /* refused */
                fi
            :: else -> skip      /* not visible, no receipt, or not resolvable */
            fi;
            principal = 0; visible = 0
        }
    :: else -> break
    od
}

init
{
    atomic {
        if
        :: scenario = FIRST_TURN
        :: scenario = CONFIRM; version = 1; thread_tenant = TA; pending = 1
        fi;
        alive[1] = 1; alive[2] = 1; alive[3] = 1;
        run worker(1, 1);
        run worker(2, 1);
        run worker(3, 2);
        run operator()
    }
}

ltl lock_released { [] (DEAD_HOLDER -> <> !DEAD_HOLDER) }
