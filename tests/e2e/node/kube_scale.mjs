// @kubernetes/client-node through the sidecar: it ignores HTTPS_PROXY, but honours the
// kubeconfig's proxy-url. Usage: KUBECONFIG=... node kube_scale.mjs REPLICAS
import * as k8s from "@kubernetes/client-node";

const kc = new k8s.KubeConfig();
kc.loadFromDefault();
const api = kc.makeApiClient(k8s.AppsV1Api);
const replicas = Number(process.argv[2]);
try {
  const scale = await api.patchNamespacedDeploymentScale(
    { name: "checkout", namespace: "default", body: { spec: { replicas } } },
    k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch),
  );
  console.log(JSON.stringify({ replicas: scale.spec.replicas }));
} catch (err) {
  console.log(JSON.stringify({ error: String(err.code || err.message).slice(0, 200) }));
}
