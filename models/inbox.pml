/*
 * A thread's inbox (issue 36), for SPIN: queue, cancel, interrupt and steer.
 *
 * The model follows src/intention_kernel/_inbox.py (Inbox.submit, Inbox._drain),
 * Kernel.cancel and the stores' ik_inbox, ik_cancels and ik_interrupts statements.
 * A turn is taken as turn_protocol.pml proves it: run under the thread's lock,
 * committed once per turn ID (the ik_turns primary key), in one atomic commit.
 * Here the lock is exclusive and a crash drops it; turn_protocol.pml explores the
 * lock's failures and the receipts inside a turn.
 *
 * Processes: a client per delivery of a message (a turn ID), a canceller, and the
 * next turn on the thread: a process that comes after every client ended, crashes
 * never, and drains the inbox (any later turn, or Kernel.drain). Each message is a
 * turn ID, 1..NM. A client runs Inbox.submit: the inbox read, one try at the lock (a
 * turn run at once), else the enqueue (one transaction: a committed turn is replayed,
 * an entry already there keeps its place), then the drain of the thread up to the
 * inbox's end. With wait (Kernel.turn) it then runs its own turn ID once more, to
 * replay its result. Crash points: after the lock, at each round boundary, before and
 * after the commit, after the enqueue and after the interrupt's request. A turn reads
 * its stop at every safe point (cancel_check_after=0).
 *
 * Configurations (-D...):
 *   (none)      QUEUE: messages 1 and 2 (1 delivered twice, once waiting); a cancel
 *               of any turn ID.
 *   INTERRUPT   message 1 runs in two rounds; messages 2 and 3 interrupt it.
 *   STEER       message 1 runs in two rounds, journaled, delivered twice, and once
 *               more after every client ended (its client redelivers it until it
 *               commits); message 2 steers it.
 *   STEER_ORPHAN  (with STEER) message 1's client never comes back: the last
 *               delivery after every client ended is the steer's, not message 1's.
 *
 * Steer, as issue 36 specifies it: at each round boundary of message 1's turn, the
 * steer entries waiting in the inbox are handed over, recorded in that round's
 * journal entry; a redelivery reads them there. The turn's commit gives each steer's
 * turn ID its result and removes the entry. A steer handed over leaves the queue:
 * the drain skips it, and re-reads under the lock that its head was not handed over.
 *
 * Properties (assertions; pan's report names the expression):
 *   (runs[msg]<=1)          no message runs (commits its effect) twice (a steer:
 *                           (runs[i]<=1));
 *   (lost==0)               at the end, every accepted message has run or was
 *                           cancelled: none lost;
 *   (late==0)               a message accepted (acknowledged) before another's first
 *                           delivery began commits first: the order of acceptance;
 *   (!(dequeued[cur])||nothing) a message cancelled out of the inbox runs no step,
 *                           and its queued turn commits nothing;
 *   other_interrupter       a turn stopped by an interrupt was stopped by another
 *                           message: the new message is never stopped by its own;
 *   (unsettled==0)          at the end, every turn that saw a stop (and did not
 *                           crash) committed what it did, once;
 *   (seen_round[i]==r)      a steer is seen by the same round on every delivery;
 *   answered                (STEER_ORPHAN) the steer's last delivery answers with a
 *                           committed result, or with SteerOrphanedError only when
 *                           its taker recorded it and has no inbox entry.
 *
 * Mutants: REMOVE_BEFORE_RUN, FRESH_TURN_ID, NO_INBOX_CHECK, NO_START_CHECK,
 * STOP_ABORTS, BASE_ONLY_INTERRUPT, INTERRUPT_BY_BASE_AT_START, NO_STEER_JOURNAL,
 * STEER_TAKES_COMMITTED, STEER_UNCHECKED_AT_BEGIN, NO_START_MARK, START_MARK_APART,
 * RELEASE_RECORDED, NO_HOLDER_CHECK, NO_TAKER_DRAIN.
 * Each must produce a counterexample (check_protocol.py).
 *
 * The start mark (ik_inbox.started): a queued turn's start reads its stop and marks
 * its entry in one transaction (start_queued). A cancel of a started entry keeps it
 * and answers "requested". NO_START_MARK writes no mark; START_MARK_APART writes it
 * in a transaction of its own, after the read. Either lets a cancel answer
 * "dequeued" for a queued turn that runs on and commits its steps. NO_HOLDER_CHECK
 * dequeues the copy of a turn whose other delivery holds the lock: it runs on.
 *
 * A steer's taker may die between the take (take_steers) and its journal entry: a
 * crash point. Its redelivery takes it again. The steer's own delivery, holding the
 * lock, puts back a steer whose taker did not commit and did not record it: it then
 * runs as its own turn, or a later boundary takes it. RELEASE_RECORDED puts back a
 * recorded one too: the taker's redelivery then commits it a second time.
 *
 * A recorded steer stays with its taker. A delivery of a steer a turn took goes to
 * Inbox._steered at once. Holding the lock, with the taker not committed, it drains
 * the inbox when the taker has an entry there (a queued taker), then answers with
 * the taker's result. With no entry (a direct taker) it raises SteerOrphanedError.
 * NO_TAKER_DRAIN raises it for a queued taker too: the code before the rule, whose
 * steer waited for a taker that nobody delivers.
 *
 * INTERRUPT_BY_BASE_AT_START is the interrupt of the code before the fix (a mutant
 * only): a request keyed by the base version alone, which a queued turn read at its
 * start and at each safe point. The message that asked for it was stopped by its
 * own request when its turn ran on that base (an entry queued before it, the
 * holder's turn failed). The default rule is the code's: the request names who
 * asked (one row per asker, with its entry's seq); a turn is stopped only by
 * another message accepted after it, and a queued turn reads only cancels at its
 * start.
 */

#ifndef MAX_CRASH
#define MAX_CRASH 2
#endif

#define NM 3                 /* messages (turn IDs) 1..NM */
#define NS 5                 /* turn IDs in the store: 1..NM, and 4 (FRESH_TURN_ID) */
#define FINAL 0              /* the next turn on the thread: it drains, never crashes */
#define BIT(x) (1 << (x))

#if defined(INTERRUPT) || defined(STEER)
#define ROUNDS_OF(x) ((x) == 1 -> 2 : 1)   /* message 1's turn runs in two rounds */
#else
#define ROUNDS_OF(x) 1
#endif

/* -- the store ------------------------------------------------------------------------- */
byte version;                /* ik_threads.version */
bit turn_row[NS];            /* ik_turns: the turn ID is committed */
byte eseq[NS];               /* ik_inbox: the entry's seq (0: no entry) */
byte emsg[NS];               /* the message the entry carries */
bit esteer[NS];              /* the entry steers the running turn (on_busy="steer") */
byte aseq[NS];               /* the seq its message was accepted with (kept) */
byte nseq;                   /* the inbox's sequence */
bit cancel_req[NS];          /* ik_cancels */
bit estarted[NS];            /* ik_inbox.started: a queued turn began under the lock */
byte intr[6];                /* ik_interrupts, per base version: who asked (bits) */
bit jround[3];               /* ik_journal of message 1's turn: round r is recorded */
byte jsteer[3];              /* the steers handed over with round r (bits) */
byte handed[NS];             /* the round a steer was handed over in (0: not yet) */

/* -- the lock and the processes ------------------------------------------------------- */
bit held;
byte crashes;
byte finished;               /* clients that ended (returned or crashed) */

/* -- ghosts ---------------------------------------------------------------------------- */
byte runs[NM + 1];           /* commits that ran the message */
byte acked;                  /* messages accepted: enqueued, or committed when run at once */
bit started[NM + 1];
byte before[NM + 1];         /* messages acknowledged when the message's first delivery began */
byte done;                   /* messages committed, or cancelled out of the inbox */
bit dequeued[NS];
bit stop_seen[NS];           /* a live turn of the ID saw a stop: it must commit */
byte seen_round[NM + 1];     /* the round a steer was first seen in (0: not yet) */
byte inrun[NS];              /* deliveries run at once (not queued) that hold the lock */
byte lost;
byte late;
byte unsettled;
bit other_interrupter;
bit orphaned;                /* the steer's delivery raised SteerOrphanedError */
bit answered;

#define NCLIENTS 4
#ifdef STEER
#define LAST 1               /* a last redelivery of message 1, which never crashes */
#else
#define LAST 0
#endif

#define CRASH \
    if \
    :: skip \
    :: !final && crashes < MAX_CRASH -> crashes++; goto crashed \
    fi

/* Whether the thread's inbox holds no entry. */
#define INBOX_EMPTY (eseq[1] == 0 && eseq[2] == 0 && eseq[3] == 0 && eseq[4] == 0)

/* A stop for turn cur at a safe point (the store's read_cancel): a cancel naming it,
   or an interrupt on its base version. */
#ifdef INTERRUPT_BY_BASE_AT_START
#define INTERRUPTED (intr[myv] != 0)
#elif defined(BASE_ONLY_INTERRUPT)
#define INTERRUPTED (intr[myv] != 0)
#else
#define INTERRUPTED ((intr[myv] & ~BIT(msg)) != 0 && (myseq == 0 || ASKED_AFTER))
#endif
/* An asker accepted after this queued turn (its seq is larger). */
#define ASKED_AFTER \
    ((BIT(1) & intr[myv] && aseq[1] > myseq) || (BIT(2) & intr[myv] && aseq[2] > myseq) || \
     (BIT(3) & intr[myv] && aseq[3] > myseq))

/* A steer waiting in the inbox that a round boundary hands over: not handed over
   already, and not run as its own turn. NO_STEER_JOURNAL: the inbox read live at
   each boundary, whatever an earlier delivery handed over. */
/* A steer entry handed over to a turn: it is that turn's, out of the queue (its
   entry goes with that turn's commit). */
#if defined(STEER) && !defined(STEER_UNCHECKED_AT_BEGIN)
#define HANDED(x) (esteer[x] && handed[x] != 0)
#else
#define HANDED(x) 0
#endif
#ifdef NO_STEER_JOURNAL
#define NOT_HANDED(x) (!(BIT(x) & mysteer))
#else
#define NOT_HANDED(x) (handed[x] == 0)
#endif
/* The steer is recorded in message 1's journal, with a round. */
#define RECORDED(x) \
    ((jround[1] && (BIT(x) & jsteer[1])) || (jround[2] && (BIT(x) & jsteer[2])))
/* Taken by message 1 (the only taker), not recorded: a crash came between the take
   and the journal entry. Its taker's redelivery takes it again. */
#ifdef NO_STEER_JOURNAL
#define RETAKEN(x) 0
#else
#define RETAKEN(x) (handed[x] != 0 && !RECORDED(x))
#endif
#ifdef STEER_TAKES_COMMITTED
#define TAKES(x) (eseq[x] != 0 && esteer[x] && (NOT_HANDED(x) || RETAKEN(x)))
#else
#define TAKES(x) (eseq[x] != 0 && esteer[x] && (NOT_HANDED(x) || RETAKEN(x)) && !turn_row[x])
#endif
/* A recorded steer whose taker is not committed: SteerOrphanedError, unless the
   taker has an inbox entry (NO_TAKER_DRAIN: always). */
#ifdef NO_TAKER_DRAIN
#define ORPHANS 1
#else
#define ORPHANS (eseq[1] == 0)
#endif
/* The steer's own delivery, holding the lock, puts back a steer whose taker is not
   committed: only one the taker did not record (RELEASE_RECORDED: any). */
#ifdef RELEASE_RECORDED
#define RELEASABLE(x) 1
#else
#define RELEASABLE(x) (!RECORDED(x))
#endif

proctype client(byte m; bit wait; byte slot; bit steer; byte final)
{
    byte cur;                /* the turn ID being run */
    byte msg;                /* its message */
    bit queued;              /* run from the inbox (TurnRequest.queued) */
    byte ret;                /* where the run returns to */
    byte myv;                /* the version the turn began on */
    byte myseq;              /* the entry's seq (0: run at once) */
    byte r;                  /* the round */
    byte rounds;
    byte mysteer;            /* steers this delivery saw (bits) */
    byte take;
    bit tojournal;           /* the steers were taken: the journal entry comes next */
    byte head;
    byte hs;
    byte i;
    byte base;
    bit clear;
    bit holding;
    bit stopped;
    bit deferred;            /* the head is a steer handed over: the drain waits */
    bit nothing;             /* it stopped before its first round's steps */
    bit begun;               /* this delivery runs at once, holding the lock: in inrun */
    bit again;               /* the steer's taker is queued: drain up to it */
    bit raised;              /* this delivery raised SteerOrphanedError */

    if
    :: final == 1 -> finished == NCLIENTS                 /* a last redelivery */
    :: final == 2 -> finished == NCLIENTS + LAST          /* after every client ended */
    :: else -> skip
    fi;
    if
    :: m == FINAL -> goto drain        /* Kernel.drain, or a turn on another thread */
    :: else -> skip
    fi;
    atomic {
        if
        :: !started[m] && !steer -> started[m] = 1; before[m] = acked
        :: else -> skip
        fi
    };
#ifdef STEER
    /* Inbox.submit: a steer a turn took goes to Inbox._steered at once. */
    if
    :: steer && handed[m] != 0 -> goto steered
    :: else -> skip
    fi;
#endif
#ifdef INTERRUPT
    /* Read before the attempt at the lock (Inbox.submit). */
    if :: m != 1 -> base = version :: else -> skip fi;
#endif
#ifndef NO_INBOX_CHECK
    atomic { clear = INBOX_EMPTY };
    if :: clear -> skip :: else -> goto accept fi;
#endif
    /* One try at the thread's lock: the turn runs at once. */
    atomic {
        if
        :: !held -> held = 1; holding = 1; inrun[m]++; begun = 1
        :: else -> skip
        fi
    };
    if
    :: holding -> cur = m; msg = m; queued = 0; myseq = 0; ret = 1; goto locked
    :: else -> skip
    fi;
accept:
    /* The enqueue: one transaction. A committed turn is replayed (no entry); an entry
       already there under the turn ID keeps its place. */
    atomic {
        if
        :: turn_row[slot] -> goto finish
        :: eseq[slot] != 0 -> skip
        :: else ->
            nseq++; eseq[slot] = nseq; emsg[slot] = m; esteer[slot] = steer;
            aseq[slot] = nseq; estarted[slot] = 0
        fi;
        acked = acked | BIT(m)
    };
    CRASH;
#ifdef INTERRUPT
    if
    :: m != 1 ->
        /* Accepted first, then the stop: one row per asker, on the base it read. */
        atomic { intr[base] = intr[base] | BIT(m) };
        CRASH
    :: else -> skip
    fi;
#endif
drain:
    /* Inbox._drain: the head, run under its own turn ID, then removed. */
    do
    :: atomic {
            head = 0; hs = 255;
            for (i : 1 .. NS - 1) {
                if
                :: eseq[i] != 0 && eseq[i] < hs && !HANDED(i) -> hs = eseq[i]; head = i
                :: else -> skip
                fi
            };
            i = 0
        };
        if
        :: head == 0 -> break
        :: else -> skip
        fi;
#ifdef REMOVE_BEFORE_RUN
        atomic { eseq[head] = 0 };
#endif
        atomic { cur = head; msg = emsg[head]; queued = 1; myseq = hs; ret = 2; head = 0; hs = 0 };
        goto lock_wait;
ran_head:
        if
        :: deferred -> deferred = 0
        :: else ->
            CRASH;
            /* Removed only after the commit (or the replay, or the refusal). */
            atomic { eseq[cur] = 0 }
        fi
    od;
#ifdef STEER
steered:
    if
    :: steer ->
        /* The steer's own delivery again (Inbox._steered), holding the lock: its
           taker is not running. Not committed, and without the steer in its journal,
           the taker lets it go: it waits in the inbox again, untaken. Recorded, it
           stays: a queued taker is drained, else the delivery raises. */
        atomic { !held -> held = 1; holding = 1 };
        CRASH;
        atomic {
            if
            :: handed[m] != 0 && !turn_row[1] && RELEASABLE(m) -> handed[m] = 0
            :: handed[m] != 0 && !turn_row[1] && !RELEASABLE(m) && ORPHANS -> orphaned = 1; raised = 1
            :: handed[m] != 0 && !turn_row[1] && !RELEASABLE(m) && !ORPHANS -> again = 1
            :: else -> skip
            fi;
            held = 0; holding = 0
        };
        if
        :: again -> again = 0; goto drain
        :: raised -> goto finish                         /* no replay */
        :: else -> skip
        fi
    :: else -> skip
    fi;
#endif
    if
    :: wait -> cur = slot; msg = m; queued = 1; myseq = 0; ret = 3; goto lock_wait
    :: else -> goto finish
    fi;

    /* -- one turn: with_turn, under the lock -------------------------------------------- */
lock_wait:
    atomic { !held -> held = 1; holding = 1 };
locked:
    CRASH;
    atomic {
        stopped = 0; mysteer = 0;
        if
        :: turn_row[cur] -> goto unlock                  /* committed: the replay */
        :: else -> skip
        fi;
#ifndef NO_START_CHECK
        /* A queued turn reads its stop first (start_queued): cancelled, it raises,
           nothing commits. An entry started before (its process died) reads none:
           the turn stops at its first safe point instead, and commits. */
        if
        :: queued && cancel_req[cur] && !estarted[cur] -> done = done | BIT(msg); goto unlock
        :: else -> skip
        fi;
#endif
#if !defined(NO_START_MARK) && !defined(START_MARK_APART)
        /* The same transaction marks the entry started: a cancel now keeps it. */
        if
        :: queued && eseq[cur] != 0 -> estarted[cur] = 1
        :: else -> skip
        fi;
#endif
#ifdef INTERRUPT_BY_BASE_AT_START
        if
        :: queued && intr[version] != 0 ->
            other_interrupter = ((intr[version] & ~BIT(msg)) != 0);
            assert(other_interrupter);
            goto unlock
        :: else -> skip
        fi;
#endif
#if defined(STEER) && !defined(STEER_UNCHECKED_AT_BEGIN)
        /* A steer handed to a turn is that turn's: it does not run as its own
           (read again under the lock: the drain read the head before). */
        if
        :: queued && esteer[cur] && handed[cur] != 0 -> deferred = 1; goto unlock
        :: else -> skip
        fi;
#endif
        myv = version;
        rounds = ROUNDS_OF(cur)
    };
#ifdef START_MARK_APART
    atomic {
        if
        :: queued && eseq[cur] != 0 -> estarted[cur] = 1
        :: else -> skip
        fi
    };
#endif
    r = 0;
    do
    :: r < rounds ->
        r++;
        CRASH;
        /* The round's boundary, a safe point: the stop, then the steers. */
        atomic {
            if
            :: cancel_req[cur] -> stopped = 1
            :: INTERRUPTED ->
                other_interrupter = ((intr[myv] & ~BIT(msg)) != 0);
                assert(other_interrupter);
                stopped = 1
            :: else -> skip
            fi;
            if
            :: stopped -> stop_seen[cur] = 1; goto stop
            :: else -> skip
            fi;
#ifdef STEER
            if
            :: cur == 1 ->
                /* The round's journal entry: read, else the steers waiting in the
                   inbox are taken (take_steers), and then recorded (fenced by the
                   lock, like every journal write). */
#ifdef NO_STEER_JOURNAL
                take = 0;
#else
                if
                :: jround[r] -> take = jsteer[r]
                :: else ->
#endif
                    take = 0;
                    for (i : 2 .. NM) {
                        if
                        :: TAKES(i)
                            -> take = take | BIT(i); handed[i] = r
                        :: else -> skip
                        fi
                    };
                    tojournal = 1
#ifndef NO_STEER_JOURNAL
                fi
#endif
            :: else -> skip
            fi
#endif
        };
#ifdef STEER
        if
        :: tojournal ->
            CRASH;                                       /* taken, not recorded */
            atomic { jround[r] = 1; jsteer[r] = take; tojournal = 0 }
        :: else -> skip
        fi;
        atomic {
            if
            :: cur == 1 ->
                mysteer = mysteer | take;
                for (i : 2 .. NM) {
                    if
                    :: BIT(i) & take ->
                        if
                        :: seen_round[i] == 0 -> seen_round[i] = r
                        :: else -> assert(seen_round[i] == r)
                        fi
                    :: else -> skip
                    fi
                }
            :: else -> skip
            fi
        }
#endif
    :: else -> break
    od;
    CRASH;
    goto commit;
stop:
#ifdef STOP_ABORTS
    goto unlock;                                         /* it raises: nothing commits */
#endif
commit:
    /* The commit: one transaction, unique per turn ID; the lock let go after it. */
    atomic {
        /* A cancelled turn ID delivered later stops at its first safe point; a
           queued one (read by a drain before the cancel) commits nothing. */
        nothing = (stopped && r == 1 && !queued);
        assert(!dequeued[cur] || nothing);
        late = (before[msg] & ~done);
        assert(late == 0);
        turn_row[cur] = 1; runs[msg]++; assert(runs[msg] <= 1);
        done = done | BIT(msg); version++; stop_seen[cur] = 0;
        if :: begun -> inrun[cur]--; begun = 0 :: else -> skip fi;
        if :: !queued -> acked = acked | BIT(msg) :: else -> skip fi;
#ifdef STEER
        /* The steers it saw: their turn IDs replay this result; their entries go. */
        for (i : 2 .. NM) {
            if
            :: BIT(i) & mysteer ->
                turn_row[i] = 1; runs[i]++; assert(runs[i] <= 1);
                eseq[i] = 0; done = done | BIT(i)
            :: else -> skip
            fi
        };
#endif
        held = 0; holding = 0
    };
    CRASH;
    goto returned;
unlock:
    atomic {
        held = 0; holding = 0;
        if :: begun -> inrun[cur]--; begun = 0 :: else -> skip fi
    };
returned:
    if
    :: ret == 1 -> goto finish
    :: ret == 2 -> goto ran_head
    :: else -> goto finish
    fi;
crashed:
    atomic {
        if :: holding -> held = 0; holding = 0 :: else -> skip fi;
        if :: begun -> inrun[cur]--; begun = 0 :: else -> skip fi;
        stop_seen[cur] = 0;
        finished++
    };
    goto end;
finish:
#ifdef STEER_ORPHAN
    /* The steer's last delivery (it never crashes): its answer. */
    if
    :: steer && final == 1 ->
        answered = (turn_row[m] || (raised && RECORDED(m) && eseq[1] == 0));
        assert(answered)
    :: else -> skip
    fi;
#endif
    if :: final == 2 -> goto check :: else -> finished++; goto end fi;
check:
    /* The end: nothing accepted is lost; every stopped turn committed. */
    atomic {
        for (i : 1 .. NM) {
            if
            :: (BIT(i) & acked) && runs[i] == 0 && !cancel_req[i] && !(orphaned && i == 2) ->
                lost++
            :: else -> skip
            fi;
            if
            :: stop_seen[i] -> unsettled++
            :: else -> skip
            fi
        };
        assert(lost == 0);
        assert(unsettled == 0)
    };
end:
    skip
}

/* Kernel.cancel of one turn ID, at any time: one transaction. */
proctype canceller()
{
    byte t;
    if
    :: t = 1
    :: t = 2
    :: t = 3
    fi;
    atomic {
        if
        :: turn_row[t] -> skip                           /* "committed" */
        :: else ->
            cancel_req[t] = 1;
            if
#ifdef NO_HOLDER_CHECK
            :: eseq[t] != 0 && !estarted[t] ->           /* "dequeued" */
#else
            :: eseq[t] != 0 && !estarted[t] && inrun[t] == 0 -> /* "dequeued" */
#endif
                /* It will not run. A delivery of the same turn ID that holds the
                   lock now (its redelivery queued beside it) is marked by every
                   store (the lease row's turn_id, a lock-file byte, a count): the
                   copy then stays. A queued one marked its entry. */
                eseq[t] = 0; dequeued[t] = 1; done = done | BIT(t)
            :: else -> skip                              /* "requested" */
            fi
        fi
    }
}

init
{
    atomic {
#ifdef INTERRUPT
        run client(1, 0, 1, 0, 0);
        run client(2, 0, 2, 0, 0);
        run client(3, 1, 3, 0, 0);
        finished++;                                      /* three clients here */
#elif defined(STEER)
        run client(1, 0, 1, 0, 0);
        run client(1, 0, 1, 0, 0);                          /* its redelivery */
        run client(2, 0, 2, 1, 0);                          /* the steer */
        finished++;                                      /* three clients here */
#else
        run client(1, 1, 1, 0, 0);
#ifdef FRESH_TURN_ID
        run client(1, 0, 4, 0, 0);                          /* a redelivery, under a new ID */
#else
        run client(1, 0, 1, 0, 0);                          /* its redelivery */
#endif
        run client(2, 1, 2, 0, 0);
        run canceller();
        finished++;                                      /* three clients here */
#endif
#ifdef STEER_ORPHAN
        /* Message 1's client never comes back; the steer's delivers it once more. */
        run client(2, 1, 2, 1, 1);
#elif defined(STEER)
        /* Message 1's client delivers it until it commits: once more, last. */
        run client(1, 1, 1, 0, 1);
#endif
        run client(FINAL, 0, 0, 0, 2)
    }
}
