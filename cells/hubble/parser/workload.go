package parser

import (
	"regexp"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// cronJobName matches a Job a CronJob made: its name and a scheduled
// time in minutes (8 to 10 digits).
var cronJobName = regexp.MustCompile(`^(.+)-\d{8,10}$`)

// WorkloadOf returns the workload a pod belongs to, as Hubble names it:
// the controller of a pod with a generated name, with a ReplicaSet that a
// Deployment made (its name ends in the pod's pod-template-hash) named as
// the Deployment and a Job that a CronJob made named as the CronJob. nil
// for a pod without a controller.
func WorkloadOf(pod *corev1.Pod) *flowpb.Workload {
	if pod == nil || pod.GenerateName == "" {
		return nil
	}
	ref := metav1.GetControllerOf(pod)
	if ref == nil {
		return nil
	}
	w := &flowpb.Workload{Kind: ref.Kind, Name: ref.Name}
	switch ref.Kind {
	case "ReplicaSet":
		if hash := pod.Labels["pod-template-hash"]; hash != "" && len(ref.Name) > len(hash)+1 && ref.Name[len(ref.Name)-len(hash)-1:] == "-"+hash {
			w.Kind, w.Name = "Deployment", ref.Name[:len(ref.Name)-len(hash)-1]
		}
	case "Job":
		if m := cronJobName.FindStringSubmatch(ref.Name); m != nil {
			w.Kind, w.Name = "CronJob", m[1]
		}
	}
	return w
}
