"""SSD / SSDlite post-processing for a whole batch at once.

torchvision's `SSD.postprocess_detections` loops over the 90 classes of
every image, and each pass indexes with a boolean mask, which waits for the
GPU: some 90 host round trips per image, milliseconds of CPU that a camera
detector at 5 fps on 100+ cameras cannot afford. `batched(model)` replaces
it on one model with the same result computed in a few tensor operations
per batch: per class the `topk_candidates` best anchors above
`score_thresh`, boxes decoded and clipped, class-wise NMS, the best
`detections_per_img` per image. (Per class, the best k above the threshold
are the best k of all that are above it, so taking the top k first changes
nothing but the order of equal scores.)

    python3 examples/python/ssd_postprocess.py [--device cuda]

checks it against torchvision's own on random head outputs and times both.
"""

import argparse
import sys
import time


def batched(model):
    """Replaces `model.postprocess_detections` (an SSD or SSDlite of
    torchvision) with the batched form. Returns whether it did (False for
    other models)."""
    needed = ("box_coder", "score_thresh", "topk_candidates", "nms_thresh", "detections_per_img")
    if not all(hasattr(model, n) for n in needed) or not hasattr(model, "anchor_generator"):
        return False
    model.postprocess_detections = lambda head_outputs, image_anchors, image_shapes: postprocess(
        model, head_outputs, image_anchors, image_shapes)
    return True


def postprocess(model, head_outputs, image_anchors, image_shapes):
    """What `SSD.postprocess_detections` returns, for the whole batch with
    three host round trips (the mask's count, the NMS and the split by image)."""
    import torch
    from torchvision.ops import boxes as box_ops

    logits = head_outputs["cls_logits"]                    # B x A x (C+1), class 0 the background
    b, a, c1 = logits.shape
    scores = torch.softmax(logits, dim=-1)[..., 1:]        # B x A x C
    k = min(model.topk_candidates, a)
    top, anchor = scores.topk(k, dim=1)                    # per image and class, its k best anchors
    boxes = torch.stack([
        box_ops.clip_boxes_to_image(model.box_coder.decode_single(reg, anc), shape)
        for reg, anc, shape in zip(head_outputs["bbox_regression"], image_anchors, image_shapes)
    ])                                                     # B x A x 4
    device = logits.device
    labels = torch.arange(1, c1, device=device).expand(b, k, c1 - 1)
    image = torch.arange(b, device=device)[:, None, None].expand(b, k, c1 - 1)
    top, anchor, labels, image = top.reshape(-1), anchor.reshape(-1), labels.reshape(-1), image.reshape(-1)
    keep = top > model.score_thresh
    top, anchor, labels, image = top[keep], anchor[keep], labels[keep], image[keep]
    box = boxes[image, anchor]
    kept = nms_by_group(box, top, image * c1 + labels, model.nms_thresh)
    per_image = [[] for _ in range(b)]
    for position, i in enumerate(image[kept].tolist()):
        if len(per_image[i]) < model.detections_per_img:
            per_image[i].append(position)
    out = []
    for positions in per_image:
        pick = kept[torch.tensor(positions, dtype=torch.long, device=device)]
        out.append({"boxes": box[pick], "scores": top[pick], "labels": labels[pick]})
    return out


def nms_by_group(box, score, group, iou):
    """One NMS for the batch with a group per image and class: each group's
    boxes moved apart by an offset (torchvision's coordinate trick, which
    its `batched_nms` leaves for a loop over the groups above 5 000 boxes),
    in float64 so that the offsets cost the boxes no precision. The kept
    indices, by score, descending."""
    import torch
    from torchvision.ops import nms

    if box.numel() == 0:
        return torch.empty(0, dtype=torch.long, device=box.device)
    box = box.double()
    apart = box + (group.double() * (box.max() + 1.0))[:, None]
    return nms(apart, score.double(), iou)


def check(device, batch=8, rounds=5):
    """Both post-processings on the same head outputs of
    ssdlite320_mobilenet_v3_large (random weights and random class logits,
    the threshold set so that about one class score in a thousand passes,
    as a trained model's few confident ones would); exits 1 when they keep different detections.
    Prints the time of each per batch."""
    import torch
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.detection.ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None)
    model = model.eval().to(device)
    images = torch.rand(batch, 3, 320, 320, device=device)
    with torch.no_grad():
        image_list, _ = model.transform(list(images))
        features = list(model.backbone(image_list.tensors).values())
        head = model.head(features)
        # A random network's class scores come out all alike (nothing would
        # pass any threshold): random logits instead, the boxes its own.
        head["cls_logits"] = torch.randn_like(head["cls_logits"]) * 2.0
        scores = torch.softmax(head["cls_logits"], dim=-1)[..., 1:].flatten()
        model.score_thresh = scores.kthvalue(int(scores.numel() * 0.999)).values.item()
        anchors = model.anchor_generator(image_list, features)
        shapes = image_list.image_sizes
        theirs = type(model).postprocess_detections(model, head, anchors, shapes)
        ours = postprocess(model, head, anchors, shapes)

        def rows(d):        # the detections, in an order that ties cannot change
            return sorted(zip(d["scores"].tolist(), d["labels"].tolist(), d["boxes"].tolist()))

        found = 0
        for i, (t, o) in enumerate(zip(theirs, ours)):
            t, o = rows(t), rows(o)
            same = len(t) == len(o) and all(
                abs(x[0] - y[0]) < 1e-6 and x[1] == y[1] and max(abs(p - q) for p, q in zip(x[2], y[2])) < 1e-3
                for x, y in zip(t, o))
            if not same:
                print(f"ssd_postprocess: image {i}: torchvision kept {len(t)} detections, the batched form "
                      f"{len(o)}, not the same", file=sys.stderr)
                return 1
            found += len(t)
        for name, f in (("torchvision", lambda: type(model).postprocess_detections(model, head, anchors, shapes)),
                        ("batched", lambda: postprocess(model, head, anchors, shapes))):
            times = []
            for _ in range(rounds):
                t0 = time.perf_counter()
                [d["scores"].cpu() for d in f()]
                times.append(time.perf_counter() - t0)
            times.sort()
            print(f"ssd_postprocess: {name}: {times[len(times) // 2] * 1e3:.2f} ms per batch of {batch} "
                  f"(median of {rounds})")
    if found == 0:
        print("ssd_postprocess: neither kept a detection: the check compared nothing", file=sys.stderr)
        return 1
    print(f"ssd_postprocess: the same {found} detections over {batch} images on {device}")
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    sys.exit(check(ap.parse_args().device))
