// stripe-node through the sidecar: an httpAgent names the proxy (stripe-node ignores
// HTTPS_PROXY) and NODE_EXTRA_CA_CERTS makes Node trust the proxy's CA.
// Usage: node stripe_refund.cjs BASE_URL PAYMENT_INTENT [PROXY_URL]
const Stripe = require("stripe");
const { HttpsProxyAgent } = require("hpagent");

const [base, paymentIntent, proxy] = process.argv.slice(2);
const url = new URL(base);
const stripe = new Stripe(process.env.STRIPE_KEY, {
  host: url.hostname,
  port: url.port,
  protocol: url.protocol.replace(":", ""),
  httpAgent: proxy ? new HttpsProxyAgent({ proxy }) : undefined,
  maxNetworkRetries: 0,
  timeout: 20000,
});
stripe.refunds
  .create({ payment_intent: paymentIntent, amount: 1000 })
  .then((refund) => console.log(JSON.stringify({ status: refund.status })))
  .catch((err) => console.log(JSON.stringify({ error: err.type, detail: String(err.detail || err.message).slice(0, 300) })));
