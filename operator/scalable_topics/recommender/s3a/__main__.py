"""``python -m scalable_topics.recommender.s3a``: resolve the s3a jars, print their directory."""

import sys

from scalable_topics.recommender.s3a import main

sys.exit(main())
