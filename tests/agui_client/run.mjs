// The official TypeScript client (@ag-ui/client) against intention-kernel's host.
//
// Usage: node run.mjs BASE_URL. Runs "charge pi_1 7" on a new thread, resumes the
// interrupt it ends on with "accept", and prints, as one JSON line, what the
// client made of it: its messages, state and pending interrupts after each run.
// The client verifies every event against the protocol and throws on a violation.
import { HttpAgent, buildResumeArray } from "@ag-ui/client";

const base = process.argv[2];
const agent = new HttpAgent({ url: `${base}/v1/agui`, threadId: "ts-client" });
agent.addMessage({ id: "u1", role: "user", content: "charge pi_1 7" });

await agent.runAgent({ runId: "ts-1" });
const afterFirst = {
  messages: structuredClone(agent.messages),
  state: structuredClone(agent.state),
  pendingInterrupts: structuredClone(agent.pendingInterrupts),
};
const resume = buildResumeArray(agent.pendingInterrupts, {
  [agent.pendingInterrupts[0].id]: { status: "resolved", payload: "accept" },
});
await agent.runAgent({ runId: "ts-2", resume });
console.log(
  JSON.stringify({
    first: afterFirst,
    second: {
      messages: agent.messages,
      state: agent.state,
      pendingInterrupts: agent.pendingInterrupts,
    },
  }),
);
