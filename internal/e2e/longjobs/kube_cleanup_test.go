package longjobs

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/fleet-dev/fleet/internal/executor/kube"
	"github.com/fleet-dev/fleet/job"
)

// TestKubeWorkerKilledBeforeCleanup: a worker publishes a job's result,
// then deletes its Job; an admission webhook of the test holds that
// deletion at the API server, and the worker is SIGKILLed meanwhile. The
// Job, its pod and its Secret are left. Once a worker runs again (the same
// id; or a peer, with another id), none of them is, and the job has its
// one result (historytest).
func TestKubeWorkerKilledBeforeCleanup(t *testing.T) {
	for _, tc := range []struct{ name, second, says string }{
		{"same_id", "first", "deleted the Jobs of an earlier life of the worker"},
		{"peer", "peer", "deleted the ended Job of another worker"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := startFleet(t)
			n := kubeNamespace(t)
			hold := holdJobDeletions(t, n)

			first := f.worker(t, n.workerArgs(t, "first", "k8s")...)
			ear := f.listen(t, "k8s")
			id := f.Submit(t, &job.Request{ID: "short-" + tc.name, Pool: "k8s", Image: "registry.example/tools:1", Command: []string{"true"},
				Env: map[string]string{"TOKEN": "s3cr3t"}, Timeout: dur(time.Minute)})
			r := f.Await(t, id, time.Minute)
			if r.Status != job.StatusSucceeded {
				t.Fatalf("result: %s %+v", r.Status, r.Failure)
			}
			var held string
			select {
			case held = <-hold.held:
			case <-time.After(30 * time.Second):
				t.Fatal("the worker did not delete the Job after the result")
			}
			first.Kill()
			hold.release()
			t.Logf("result published; the worker was killed while its deletion of Job %s was held", held)

			if left := n.leftOf(t, id); left.jobs != 1 || left.pods != 1 || left.secrets != 1 {
				t.Fatalf("left by the killed worker: %+v, want its Job, pod and Secret", left)
			}
			second := f.worker(t, n.workerArgs(t, tc.second, "k8s")...)
			waitFor(t, "nothing left of the job", 30*time.Second, func() bool { return n.leftOf(t, id) == leftovers{} })
			if !strings.Contains(second.Output(), tc.says) {
				t.Errorf("the second worker did not say %q", tc.says)
			}
			if s, err := f.Client.Status(context.Background(), id); err != nil || s.Job.State != job.StateSucceeded || s.Job.Attempt != 1 {
				t.Errorf("record: %+v, %v; want one attempt, succeeded", s.Job, err)
			}
			f.requireHistory(t, "k8s", []string{id}, ear)
		})
	}
}

type leftovers struct{ jobs, pods, secrets int }

// leftOf counts the Jobs, pods and Secrets of a fleet job in the namespace.
func (n *namespace) leftOf(t *testing.T, id string) leftovers {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sel := metav1.ListOptions{LabelSelector: kube.LabelJobID + "=" + id}
	jobs, err := n.env.Client.BatchV1().Jobs(n.name).List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	pods, err := n.env.Client.CoreV1().Pods(n.name).List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	secrets, err := n.env.Client.CoreV1().Secrets(n.name).List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	return leftovers{len(jobs.Items), len(pods.Items), len(secrets.Items)}
}

// hold is a validating admission webhook, served by the test, that holds
// the worker's deletions of Jobs in one namespace until release, then
// refuses them; after release it allows all.
type hold struct {
	held     chan string // the name of the first Job whose deletion is held
	released chan struct{}
	once     sync.Once
}

func (h *hold) release() { h.once.Do(func() { close(h.released) }) }

const probeJob = "webhook-probe"

// holdJobDeletions installs the webhook for the namespace's worker
// ServiceAccount, and returns once the API server calls it.
func holdJobDeletions(t *testing.T, n *namespace) *hold {
	t.Helper()
	h := &hold{held: make(chan string, 1), released: make(chan struct{})}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var review admissionv1.AdmissionReview
		if err := json.NewDecoder(r.Body).Decode(&review); err != nil || review.Request == nil {
			http.Error(w, "not an AdmissionReview", http.StatusBadRequest)
			return
		}
		req := review.Request
		review.Response = &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
		select {
		case <-h.released:
		default:
			if req.Name != probeJob {
				select {
				case h.held <- req.Name:
				default:
				}
				select {
				case <-h.released:
				case <-r.Context().Done():
				}
			}
			review.Response.Allowed = false
			review.Response.Result = &metav1.Status{Message: "held by the test", Code: http.StatusForbidden}
		}
		review.Request = nil
		_ = json.NewEncoder(w).Encode(&review)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(h.release)

	ctx := context.Background()
	name := "fleet-test-hold-" + n.name
	fail := admissionregistrationv1.Fail
	none := admissionregistrationv1.SideEffectClassNone
	url := srv.URL + "/validate"
	_, err := n.env.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:         "hold.fleet.test",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Delete},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{"batch"}, APIVersions: []string{"v1"}, Resources: []string{"jobs"}},
			}},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": n.name}},
			MatchConditions: []admissionregistrationv1.MatchCondition{{Name: "the-worker",
				Expression: fmt.Sprintf("request.userInfo.username == 'system:serviceaccount:%s:fleet-worker'", n.name)}},
			FailurePolicy:           &fail,
			SideEffects:             &none,
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          new(int32(30)),
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create the webhook: %v", err)
	}
	t.Cleanup(func() {
		_ = n.env.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(context.Background(), name, metav1.DeleteOptions{})
	})

	// The API server takes the webhook up asynchronously: a dry-run
	// deletion by the worker's account is refused once it has.
	probe := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: probeJob}, Spec: batchv1.JobSpec{
		Suspend: new(true),
		Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
			SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: new(true), RunAsUser: new(int64(65532)),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			Containers: []corev1.Container{{Name: "c", Image: "registry.example/tools:1", SecurityContext: &corev1.SecurityContext{
				AllowPrivilegeEscalation: new(false), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}}}}},
	}}
	bg := metav1.DeletePropagationBackground
	if _, err := n.env.Client.BatchV1().Jobs(n.name).Create(ctx, probe, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create the probe Job: %v", err)
	}
	as, err := kubernetes.NewForConfig(n.env.ConfigFor(t, n.name, "fleet-worker"))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the webhook to be called", 30*time.Second, func() bool {
		err := as.BatchV1().Jobs(n.name).Delete(ctx, probeJob, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}, PropagationPolicy: &bg})
		return apierrors.IsForbidden(err)
	})
	if err := n.env.Client.BatchV1().Jobs(n.name).Delete(ctx, probeJob, metav1.DeleteOptions{PropagationPolicy: &bg}); err != nil {
		t.Fatalf("delete the probe Job: %v", err)
	}
	return h
}
