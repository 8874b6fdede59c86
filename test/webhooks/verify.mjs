// Verifies webhook deliveries with the standardwebhooks package (a real
// Standard Webhooks verifier, not ours). stdin: a JSON array of
// {secret, headers, body}; stdout: a JSON array of "ok" or the verifier's
// refusal, one per delivery, in order.
import { Webhook } from "standardwebhooks";

let input = "";
for await (const chunk of process.stdin) input += chunk;
const out = JSON.parse(input).map(({ secret, headers, body }) => {
  try {
    new Webhook(secret).verify(body, headers);
    return "ok";
  } catch (e) {
    return "refused: " + e.message;
  }
});
process.stdout.write(JSON.stringify(out));
