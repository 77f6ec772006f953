"""The product's URLs plus ``/bench/touch``: the heartbeat bench's baseline.

The baseline is the least a Django view can do for an agent's heartbeat on the same stack: parse
the JSON body and update one row by primary key (one UPDATE). No auth, no validation.
"""

import json

from django.http import JsonResponse
from django.urls import path
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from jobs.models import Attempt
from nomadgpu.urls import urlpatterns as product_urlpatterns


@csrf_exempt
def touch(request):
    body = json.loads(request.body)
    Attempt.objects.filter(pk=body["id"]).update(
        last_seq=body["seq"], last_heartbeat_at=timezone.now()
    )
    return JsonResponse({"command": "continue"})


urlpatterns = [path("bench/touch", touch), *product_urlpatterns]
