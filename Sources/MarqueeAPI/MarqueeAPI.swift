// MarqueeAPI
