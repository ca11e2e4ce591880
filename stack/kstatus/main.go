// kstatus prints how the kstatus library (sigs.k8s.io/cli-utils), which Flux and kpt use to
// wait for resources, reads each Kubernetes object given as JSON on stdin: one line per object,
// {"name": ..., "status": "InProgress|Current|Failed|Terminating|...", "message": ...}.
// Input: one object, or a List (`kubectl get -o json`).
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

func main() {
	raw, err := io.ReadAll(os.Stdin)
	if err != nil {
		fail(err)
	}
	var obj unstructured.Unstructured
	if err := obj.UnmarshalJSON(raw); err != nil {
		fail(err)
	}
	items := []unstructured.Unstructured{obj}
	if obj.IsList() {
		list, err := obj.ToList()
		if err != nil {
			fail(err)
		}
		items = list.Items
	}
	out := json.NewEncoder(os.Stdout)
	for i := range items {
		res, err := status.Compute(&items[i])
		if err != nil {
			fail(err)
		}
		line := map[string]string{"name": items[i].GetName(), "status": res.Status.String(), "message": res.Message}
		if err := out.Encode(line); err != nil {
			fail(err)
		}
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "kstatus:", err)
	os.Exit(1)
}
